import HTTPTypes
import LockAudit
import Metrics

/// `upstreams.NAME.circuit_breaker`: one shared count of the upstream's requests in flight, and
/// one limit, `min(max_requests, connections + max_pending)` (connections: `max_connections` per
/// endpoint; a resolved upstream counts one endpoint's, its count of addresses changes). Past it, a
/// request is refused at once with `503 upstream_overloaded` and `Retry-After`.
///
/// A request counts from its admission until its response is over (its head, or the end of a
/// streamed body): the caller releases it then. The count is a `SharedCap`, one atomic every loop
/// writes twice per request: the one shared word of a balanced upstream's request path, and only
/// when a breaker is configured.
///
/// - `portico_upstream_overloaded_total{upstream,reason}`: refusals (`reason`: `max_requests`, or
///   `max_pending` when that is the tighter limit).
struct CircuitBreaker: Sendable {
    let maxRequests: Int
    let maxPending: Int
    private let upstream: String
    private let inFlight: SharedCap
    private let limit: Int
    /// The limit is `max_pending`'s (more requests than the connections carry, waiting).
    private let limitIsPending: Bool
    private let refusals: Counter

    /// `nil` without `circuit_breaker`.
    init?(_ config: UpstreamConfig, metricsFactory: any MetricsFactory) {
        guard let breaker = config.circuitBreaker else { return nil }
        let capacity = config.endpoints.count * max(1, config.maxConnections)
        let pendingLimit = capacity + breaker.maxPending
        upstream = config.name
        maxRequests = breaker.maxRequests
        maxPending = breaker.maxPending
        inFlight = SharedCap(name: "upstreams.\(config.name).max_requests")
        limit = min(breaker.maxRequests, pendingLimit)
        limitIsPending = pendingLimit < breaker.maxRequests
        refusals = Counter(label: "portico_upstream_overloaded_total",
                           dimensions: [("upstream", config.name), ("reason", limitIsPending ? "max_pending" : "max_requests")],
                           factory: metricsFactory)
    }

    /// Counts one more request in flight, or refuses it (`upstream_overloaded`, counted).
    func admit() throws(GatewayError) {
        guard inFlight.tryAcquire(limit: limit) else { throw refusal() }
    }

    /// One admitted request's response is over.
    func release() {
        inFlight.release()
    }

    /// Requests counted now.
    var current: Int { max(0, inFlight.current) }

    private func refusal() -> GatewayError {
        refusals.increment()
        let limit = limitIsPending
            ? "more than \(maxPending) requests waiting for a connection (max_pending)"
            : "\(maxRequests) requests in flight (max_requests)"
        var fields = HTTPFields()
        fields[.retryAfter] = "1"
        return GatewayError(.upstreamOverloaded, message: "upstream \(upstream) has \(limit); retry later", headerFields: fields)
    }
}
