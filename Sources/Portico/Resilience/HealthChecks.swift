import HTTPTypes
import Logging
import Synchronization

/// One endpoint's health as its checks say (`health_check`). Written only by the endpoint's one
/// check task (`EndpointHealthCheck`, this file: nothing else can), when a check finishes; loaded
/// per pick (`OutlierDetector.status` reads the verdict).
struct HealthRecord: ~Copyable, Sendable {
    fileprivate let verdict = Atomic<Int>(EndpointState.Health.unknown.rawValue)
    /// Checks in a row that agreed (passes while unhealthy or unknown, failures while healthy).
    fileprivate let streak = Atomic<Int>(0)
    /// Checks finished.
    fileprivate let checks = Atomic<Int>(0)

    init() {}

    var current: EndpointState.Health {
        EndpointState.Health(rawValue: verdict.load(ordering: .relaxed)) ?? .unknown
    }

    var checksDone: Int { checks.load(ordering: .relaxed) }
}

/// The health checks of one upstream's endpoints: one task per endpoint, by address, and the only
/// owner of their lifetimes. A check starts with its endpoint and stops when the endpoint goes (a
/// DNS answer without it), when a successor takes the endpoints over at a reload, or at shutdown.
final class HealthChecks: Sendable {
    private let config: HealthCheckConfig?
    private let upstream: String
    private let clock: any GatewayClock
    private let logger: Logger
    private let tasks = Mutex<[String: Task<Void, Never>]>([:])

    /// `config`: `nil` without `health_check` (then nothing is ever started).
    init(config: HealthCheckConfig?, upstream: String, clock: any GatewayClock, logger: Logger) {
        self.config = config
        self.upstream = upstream
        self.clock = clock
        self.logger = logger
    }

    /// Starts checking each of `endpoints` (replacing a check of the same address).
    func start(_ endpoints: [EndpointState]) {
        guard let config else { return }
        for endpoint in endpoints {
            let check = EndpointHealthCheck(endpoint: endpoint, config: config, upstream: upstream, clock: clock, logger: logger)
            let task = Task { await check.run() }
            tasks.withLock { $0[endpoint.address]?.cancel(); $0[endpoint.address] = task }
        }
    }

    /// Stops checking `endpoints` (they left the upstream); does not wait.
    func stop(_ endpoints: [EndpointState]) {
        let gone = tasks.withLock { tasks in endpoints.compactMap { tasks.removeValue(forKey: $0.address) } }
        for task in gone { task.cancel() }
    }

    /// Stops every check; does not wait (a successor checks these endpoints now).
    func cancelAll() {
        for task in takeAll() { task.cancel() }
    }

    /// Stops every check and waits for each to end.
    func stopAll() async {
        let all = takeAll()
        for task in all { task.cancel() }
        for task in all { await task.value }
    }

    private func takeAll() -> [Task<Void, Never>] {
        tasks.withLock { tasks in
            defer { tasks = [:] }
            return Array(tasks.values)
        }
    }
}

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
            endpoint.health.checks.wrappingAdd(1, ordering: .relaxed)
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
            if endpoint.health.streak.load(ordering: .relaxed) != 0 { endpoint.health.streak.store(0, ordering: .relaxed) }
            return
        case (.unknown, true):
            next = .healthy
        case (.unhealthy, true):
            let count = endpoint.health.streak.wrappingAdd(1, ordering: .relaxed).newValue
            guard count >= config.healthy else { return }
            next = .healthy
        case (.healthy, false), (.unknown, false):
            let count = endpoint.health.streak.wrappingAdd(1, ordering: .relaxed).newValue
            guard count >= config.unhealthy else { return }
            next = .unhealthy
        }
        endpoint.health.streak.store(0, ordering: .relaxed)
        endpoint.health.verdict.store(next.rawValue, ordering: .relaxed)
        endpoint.metrics.healthy.record(next == .healthy ? 1 : 0)
        if next != .healthy || state == .unhealthy {
            logger.log(level: next == .healthy ? .info : .warning, "upstream endpoint health changed", metadata: [
                "upstream": "\(upstream)", "endpoint": "\(endpoint.address)", "health": "\(next)",
            ])
        }
    }
}
