import Foundation
import Synchronization

/// One endpoint of an upstream: its transport client (with its own per-loop pool on `nio`) and
/// its health and ejection record.
///
/// The record is atomics written only when something changes — a failure, an ejection, a health
/// check's verdict, the first success after failures — and read per request by the balancer. A
/// success on a healthy endpoint writes nothing (it loads the failure count and finds it zero), so
/// the request path writes no word another core writes.
///
/// Instants are nanoseconds since the owning set's `origin` (on its injected clock): 0 means "never".
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
    /// (client, pool and record) while they stay the same.
    let config: UpstreamConfig
    let client: any UpstreamClient
    let metrics: EndpointMetrics

    let consecutiveFailures = Atomic<Int>(0)
    /// Ejected while the clock reads before this.
    let ejectedUntil = Atomic<Int64>(0)
    /// Ejections in a row (reset by a success after the last one): multiplies `base_ejection`.
    /// While non-zero and not ejected, the endpoint is on probation: one failure ejects it again.
    let ejectionsInARow = Atomic<Int>(0)
    let ejectionReason = Atomic<UInt8>(0)
    let ejectionsTotal = Atomic<Int>(0)
    let lastFailure = Atomic<UInt8>(0)
    let lastFailureAt = Atomic<Int64>(0)
    let health = Atomic<Int>(Health.unknown.rawValue)
    /// Checks in a row that agreed (passes while unhealthy or unknown, failures while healthy).
    let healthStreak = Atomic<Int>(0)
    /// Health checks finished (written by the endpoint's one check task).
    let healthChecks = Atomic<Int>(0)

    /// Health checks finished so far.
    public var healthChecksDone: Int { healthChecks.load(ordering: .relaxed) }

    init(url: URL, config: UpstreamConfig, client: any UpstreamClient, metrics: EndpointMetrics) {
        self.url = url
        self.config = config
        self.address = UpstreamTarget(baseURL: url).authority
        self.client = client
        self.metrics = metrics
    }

    public var currentHealth: Health { Health(rawValue: health.load(ordering: .relaxed)) ?? .unknown }

    func isEjected(at now: Int64) -> Bool {
        ejectedUntil.load(ordering: .relaxed) > now
    }

    /// Takes traffic: not ejected and not failing its health check.
    @inline(__always)
    func isUsable(at now: Int64) -> Bool {
        ejectedUntil.load(ordering: .relaxed) <= now && health.load(ordering: .relaxed) != Health.unhealthy.rawValue
    }

    /// Usable and not failing `threshold` times in a row (one the ejection cap kept in rotation
    /// is usable, not up): while none is up, every endpoint is tried.
    @inline(__always)
    func isUp(at now: Int64, threshold: Int) -> Bool {
        isUsable(at: now) && consecutiveFailures.load(ordering: .relaxed) < threshold
    }
}
