import Foundation

/// One endpoint of an upstream: its transport client (with its own per-loop pool on `nio`) and
/// its records, each written by its one owner: `outlier` (failures and ejections) by the
/// upstream's `OutlierDetector`, `health` (the checks' verdict) by its `EndpointHealthCheck`.
/// What the two mean together is `EndpointStatus` (`OutlierDetector.status(of:at:)`).
///
/// The records are atomics written only when something changes and loaded per request by the
/// balancer; a success on an endpoint that is up writes nothing, so the request path writes no
/// word another core writes. A reload that keeps the endpoint keeps the object, records included.
public final class EndpointState: Sendable {
    /// Health as the active checks last said.
    public enum Health: Int, Sendable, CustomStringConvertible {
        /// No check configured or none finished yet.
        case unknown = 0
        case healthy
        case unhealthy

        public var description: String {
            switch self {
            case .unknown: "unknown"
            case .healthy: "healthy"
            case .unhealthy: "unhealthy"
            }
        }
    }

    public let url: URL
    /// `host:port`, as configured or resolved: its identity (with the upstream's name) across
    /// reloads, and its metric label.
    public let address: String
    /// Its transport settings (`BalancedUpstream.endpointConfig`): a reload keeps the endpoint
    /// (client, pool and records) while they stay the same.
    let config: UpstreamConfig
    let client: any UpstreamClient
    let metrics: EndpointMetrics
    let outlier = OutlierRecord()
    let health = HealthRecord()

    init(url: URL, config: UpstreamConfig, client: any UpstreamClient, metrics: EndpointMetrics) {
        self.url = url
        self.config = config
        self.address = UpstreamTarget(baseURL: url).authority
        self.client = client
        self.metrics = metrics
    }

    /// The health checks' verdict now.
    public var currentHealth: Health { health.current }

    /// Health checks finished so far.
    public var healthChecksDone: Int { health.checksDone }
}
