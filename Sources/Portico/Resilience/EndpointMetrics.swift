import Metrics

/// One endpoint's metric handles, made once when its upstream is built. Labels are the upstream's
/// name and the endpoint's address (from configuration or DNS, never from a request), and a
/// failure kind from the closed `EndpointFailure` set: bounded.
///
/// - `portico_upstream_endpoint_requests_total{upstream,endpoint}`: attempts sent to it.
/// - `portico_upstream_endpoint_failures_total{upstream,endpoint,kind}`: attempts that counted against it.
/// - `portico_upstream_endpoint_ejections_total{upstream,endpoint}`
/// - `portico_upstream_endpoint_ejected{upstream,endpoint}`: 1 from an ejection until its first
///   success afterwards, else 0: the `EndpointStatus` the outlier detector moved it to
///   (`record(_:)`), kept through probation, which begins with no event.
/// - `portico_upstream_endpoint_healthy{upstream,endpoint}`: the health check's verdict (1, 0),
///   -1 before the first (or without checks).
final class EndpointMetrics: Sendable {
    let requests: Counter
    private let failures: [Counter]
    let ejections: Counter
    let ejected: Gauge
    let healthy: Gauge

    init(upstream: String, endpoint: String, factory: any MetricsFactory = MetricsSystem.factory) {
        let dimensions = [("upstream", upstream), ("endpoint", endpoint)]
        requests = Counter(label: "portico_upstream_endpoint_requests_total", dimensions: dimensions, factory: factory)
        failures = EndpointFailure.allCases.map { kind in
            Counter(label: "portico_upstream_endpoint_failures_total", dimensions: dimensions + [("kind", kind.name)], factory: factory)
        }
        ejections = Counter(label: "portico_upstream_endpoint_ejections_total", dimensions: dimensions, factory: factory)
        ejected = Gauge(label: "portico_upstream_endpoint_ejected", dimensions: dimensions, factory: factory)
        healthy = Gauge(label: "portico_upstream_endpoint_healthy", dimensions: dimensions, factory: factory)
        ejected.record(0)
        healthy.record(-1)
    }

    func failed(_ kind: EndpointFailure) {
        failures[Int(kind.rawValue) - 1].increment()
    }

    /// The status the outlier detector just moved the endpoint to (an ejection, or the success
    /// that cleared its record): the `ejected` gauge's one source.
    func record(_ status: EndpointStatus) {
        switch status {
        case .ejected, .probation: ejected.record(1)
        case .up, .failing, .unhealthy: ejected.record(0)
        }
    }
}

/// An upstream's own balancing metric (the breaker's refusals are `CircuitBreaker`'s):
/// - `portico_upstream_all_endpoints_down_total{upstream}`: attempts made while no endpoint was
///   up (each ejected, unhealthy or failing), spread over all of them.
final class BalancedUpstreamMetrics: Sendable {
    let allDown: Counter

    init(upstream: String, factory: any MetricsFactory = MetricsSystem.factory) {
        allDown = Counter(label: "portico_upstream_all_endpoints_down_total", dimensions: [("upstream", upstream)], factory: factory)
    }
}
