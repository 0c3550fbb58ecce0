import HTTPTypes
import Logging

/// The active check of one endpoint (`health_check`): every `interval` on the injected clock, a
/// `GET path` through the endpoint's own transport client, bounded by `timeout`. It runs in its
/// own task, whatever the traffic, and goes through neither the route's chain nor the balancer:
/// it is never counted as a request. It is the only writer of the endpoint's health.
///
/// `unhealthy` failures in a row (a status outside `expect`, no answer within `timeout`, no
/// connection) make the endpoint unhealthy, and it gets no traffic; `healthy` passes in a row make
/// it healthy again. Before its first verdict an endpoint is `unknown` and takes traffic; from
/// there one pass makes it healthy.
struct EndpointHealthCheck: Sendable {
    let endpoint: EndpointState
    let config: HealthCheckConfig
    let upstream: String
    let clock: any GatewayClock
    let logger: Logger

    /// Checks until the task is cancelled (at the upstream's shutdown).
    func run() async {
        while !Task.isCancelled {
            do {
                try await clock.sleep(for: config.interval)
            } catch {
                return
            }
            let passed = await probe()
            if Task.isCancelled { return }
            record(passed)
            endpoint.healthChecks.wrappingAdd(1, ordering: .relaxed)
        }
    }

    func probe() async -> Bool {
        let head = HTTPRequest(method: .get, scheme: "http", authority: nil, path: config.path)
        let context = RequestContext(requestID: "health-check", upstream: upstream,
                                     deadline: clock.now.advanced(by: config.timeout), logger: logger, clock: clock)
        do {
            let response = try await endpoint.client.send(GatewayRequest(head: head), context: context)
            response.discardBody()
            return config.expect.contains(response.status.code)
        } catch {
            return false
        }
    }

    func record(_ passed: Bool) {
        let state = endpoint.currentHealth
        let next: EndpointState.Health
        switch (state, passed) {
        case (.healthy, true), (.unhealthy, false):
            if endpoint.healthStreak.load(ordering: .relaxed) != 0 { endpoint.healthStreak.store(0, ordering: .relaxed) }
            return
        case (.unknown, true):
            next = .healthy
        case (.unhealthy, true):
            let count = endpoint.healthStreak.wrappingAdd(1, ordering: .relaxed).newValue
            guard count >= config.healthy else { return }
            next = .healthy
        case (.healthy, false), (.unknown, false):
            let count = endpoint.healthStreak.wrappingAdd(1, ordering: .relaxed).newValue
            guard count >= config.unhealthy else { return }
            next = .unhealthy
        }
        endpoint.healthStreak.store(0, ordering: .relaxed)
        endpoint.health.store(next.rawValue, ordering: .relaxed)
        endpoint.metrics.healthy.record(next == .healthy ? 1 : 0)
        if next != .healthy || state == .unhealthy {
            logger.log(level: next == .healthy ? .info : .warning, "upstream endpoint health changed", metadata: [
                "upstream": "\(upstream)", "endpoint": "\(endpoint.address)", "health": "\(next)",
            ])
        }
    }
}
