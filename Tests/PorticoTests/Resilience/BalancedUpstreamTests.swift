import Foundation
import HTTPTypes
import Logging
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// A transport stub per endpoint: answers what the test scripts for its address, counts calls.
final class ScriptedEndpoints: Sendable {
    enum Answer: Sendable {
        case status(Int)
        case error(GatewayError.Kind)
        case cancelled
        /// Waits on the gate, then answers 200.
        case held(AsyncGate)
    }

    private let state = Mutex<(answers: [String: Answer], calls: [String: Int])>(([:], [:]))

    func script(_ address: String, _ answer: Answer) {
        state.withLock { $0.answers[address] = answer }
    }

    func calls(_ address: String) -> Int { state.withLock { $0.calls[address] ?? 0 } }

    func resetCalls() { state.withLock { $0.calls = [:] } }

    func client(_ config: UpstreamConfig) -> any UpstreamClient {
        Client(config: config, address: UpstreamTarget(baseURL: config.url).authority, owner: self)
    }

    func answer(_ address: String) -> Answer {
        state.withLock { state in
            state.calls[address, default: 0] += 1
            return state.answers[address] ?? .status(200)
        }
    }

    struct Client: UpstreamClient {
        let config: UpstreamConfig
        let address: String
        let owner: ScriptedEndpoints

        func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
            switch owner.answer(address) {
            case .status(let code):
                return GatewayResponse(status: HTTPResponse.Status(code: code), headerFields: [:], body: Body(string: address))
            case .error(let kind):
                throw GatewayError(kind, message: "scripted")
            case .cancelled:
                throw CancellationError()
            case .held(let gate):
                await gate.wait()
                return GatewayResponse(status: .ok, headerFields: [:], body: Body(string: address))
            }
        }

        func shutdown() async {}
        func retire() async {}
    }
}

/// Issue #34: picking, failure classification, ejection, the cap, all-down, retries and the
/// breaker, on `BalancedUpstream` with scripted endpoints and an injected clock.
@Suite("Resilience: BalancedUpstream")
struct BalancedUpstreamTests {
    static let addresses = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]

    static func make(_ scripted: ScriptedEndpoints, count: Int = 3, clock: ManualClock = ManualClock(),
                     metrics: RecordingMetrics = RecordingMetrics(),
                     configure: (inout UpstreamConfig) -> Void = { _ in }) -> BalancedUpstream {
        var config = UpstreamConfig(name: "orders", endpoints: addresses.prefix(count).map { URL(string: "http://\($0)")! })
        config.outlierDetection.consecutiveFailures = 3
        config.outlierDetection.baseEjection = .seconds(30)
        config.outlierDetection.maxEjection = 1
        configure(&config)
        return BalancedUpstream(config: config, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
                                loops: .shared, clock: clock, metricsFactory: metrics, makeClient: scripted.client)
    }

    static func context(_ clock: ManualClock, stats: RequestStats = RequestStats()) -> RequestContext {
        RequestContext(requestID: "r", route: "r", upstream: "orders", deadline: clock.now.advanced(by: .seconds(30)),
                       logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }), clock: clock, stats: stats)
    }

    /// Sends `count` requests one after the other; returns the statuses (0 for a thrown error).
    @discardableResult
    static func send(_ upstream: BalancedUpstream, _ clock: ManualClock, count: Int) async -> [Int] {
        var statuses: [Int] = []
        for _ in 0..<count {
            do {
                statuses.append(try await upstream.send(Fixture.request(), context: context(clock)).status.code)
            } catch {
                statuses.append(0)
            }
        }
        return statuses
    }

    func isEjected(_ upstream: BalancedUpstream, _ index: Int, _ clock: ManualClock) -> Bool {
        if case .ejected = upstream.status(of: upstream.endpoints[index]) { return true }
        return false
    }

    @Test("round_robin spreads attempts evenly; random and least_request reach every endpoint")
    func spreads() async {
        for balance in BalanceStrategy.allCases {
            let scripted = ScriptedEndpoints()
            let clock = ManualClock()
            let upstream = Self.make(scripted, clock: clock) { $0.balance = balance }
            await Self.send(upstream, clock, count: 300)
            let calls = Self.addresses.map(scripted.calls)
            #expect(calls.reduce(0, +) == 300)
            if balance == .roundRobin {
                #expect(calls == [100, 100, 100])
            } else {
                #expect(calls.allSatisfy { $0 > 40 }, "\(balance): \(calls)")
            }
        }
    }

    @Test("503 from one endpoint ejects it after consecutive_failures; a 404 never does")
    func gatewayStatusEjects404DoesNot() async {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let upstream = Self.make(scripted, clock: clock)
        scripted.script(Self.addresses[0], .status(503))
        scripted.script(Self.addresses[1], .status(404))
        let statuses = await Self.send(upstream, clock, count: 30)
        // Round robin: the 503 endpoint is tried 3 times, then ejected.
        #expect(statuses.filter { $0 == 503 }.count == 3)
        #expect(isEjected(upstream, 0, clock))
        #expect(!isEjected(upstream, 1, clock))
        #expect(scripted.calls(Self.addresses[1]) >= 13)
        #expect(upstream.status(of: upstream.endpoints[0]) == .ejected(until: clock.now.advanced(by: .seconds(30)), reason: .gatewayStatus))
    }

    @Test("a plain 500 counts only with failures: 5xx")
    func serverErrorPolicy() async {
        for policy in OutlierDetectionConfig.Failures.allCases {
            let scripted = ScriptedEndpoints()
            let clock = ManualClock()
            let upstream = Self.make(scripted, clock: clock) { $0.outlierDetection.failures = policy }
            scripted.script(Self.addresses[0], .status(500))
            await Self.send(upstream, clock, count: 12)
            #expect(isEjected(upstream, 0, clock) == (policy == .serverErrors), "\(policy)")
        }
    }

    @Test("connect failures, resets and timeouts count; the client leaving and a TLS failure do not")
    func errorClassification() async {
        #expect(EndpointFailure(error: GatewayError(.upstreamConnectFailed, message: "")) == .connectFailed)
        #expect(EndpointFailure(error: GatewayError(.upstreamConnectionClosed, message: "")) == .reset)
        #expect(EndpointFailure(error: GatewayError(.upstreamTimeout, message: "")) == .timeout)
        #expect(EndpointFailure(error: GatewayError(.upstreamConnectTimeout, message: "")) == .timeout)
        #expect(EndpointFailure(error: GatewayError(.clientClosedRequest, message: "")) == nil)
        #expect(EndpointFailure(error: CancellationError()) == nil)
        #expect(EndpointFailure(error: GatewayError(.upstreamTLSError, message: "")) == nil)
        #expect(EndpointFailure(status: 404, policy: .serverErrors) == nil)
        #expect(EndpointFailure(status: 504, policy: .gateway) == .gatewayStatus)

        for (answer, ejects) in [(ScriptedEndpoints.Answer.error(.upstreamConnectFailed), true),
                                 (.error(.upstreamConnectionClosed), true), (.error(.upstreamTimeout), true),
                                 (.cancelled, false), (.error(.clientClosedRequest), false)] {
            let scripted = ScriptedEndpoints()
            let clock = ManualClock()
            let upstream = Self.make(scripted, clock: clock)
            scripted.script(Self.addresses[2], answer)
            await Self.send(upstream, clock, count: 12)
            #expect(isEjected(upstream, 2, clock) == ejects, "\(answer)")
        }
    }

    @Test("an ejection lasts base_ejection × ejections in a row; then one failure ejects again, one success resets")
    func ejectionDurations() async {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let upstream = Self.make(scripted, clock: clock)
        scripted.script(Self.addresses[0], .status(502))
        await Self.send(upstream, clock, count: 9)
        #expect(isEjected(upstream, 0, clock))
        clock.advance(by: .seconds(29))
        #expect(isEjected(upstream, 0, clock))
        clock.advance(by: .seconds(1))
        #expect(upstream.status(of: upstream.endpoints[0]) == .probation)
        // Back on probation: its next attempt fails, and it is out again, for 2 × 30 s.
        scripted.resetCalls()
        await Self.send(upstream, clock, count: 3)
        #expect(scripted.calls(Self.addresses[0]) == 1)
        #expect(isEjected(upstream, 0, clock))
        clock.advance(by: .seconds(59))
        #expect(isEjected(upstream, 0, clock))
        clock.advance(by: .seconds(1))
        #expect(upstream.status(of: upstream.endpoints[0]) == .probation)
        // It recovered: one success clears its record, and 3 failures are needed again.
        scripted.script(Self.addresses[0], .status(200))
        scripted.resetCalls()
        await Self.send(upstream, clock, count: 3)
        #expect(scripted.calls(Self.addresses[0]) == 1)
        #expect(upstream.status(of: upstream.endpoints[0]) == .up)
        scripted.script(Self.addresses[0], .status(502))
        await Self.send(upstream, clock, count: 6)
        #expect(!isEjected(upstream, 0, clock))
        await Self.send(upstream, clock, count: 3)
        #expect(isEjected(upstream, 0, clock))
        // A fresh run of ejections: 30 s again.
        clock.advance(by: .seconds(30))
        #expect(!isEjected(upstream, 0, clock))
    }

    @Test("max_ejection never ejects the last available endpoint, however it rounds")
    func ejectionCap() async {
        // Two endpoints, 100 %: both fail, only one is ejected.
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let two = Self.make(scripted, count: 2, clock: clock)
        scripted.script(Self.addresses[0], .status(503))
        scripted.script(Self.addresses[1], .status(503))
        await Self.send(two, clock, count: 20)
        #expect([0, 1].filter { isEjected(two, $0, clock) }.count == 1)

        // Three endpoints, 50 % (1.5, rounded down): at most one is ejected.
        let three = Self.make(scripted, clock: clock) { $0.outlierDetection.maxEjection = 0.5 }
        scripted.script(Self.addresses[2], .status(503))
        await Self.send(three, clock, count: 30)
        #expect([0, 1, 2].filter { isEjected(three, $0, clock) }.count == 1)

        // One endpoint, 100 %: never ejected.
        let one = Self.make(scripted, count: 1, clock: clock)
        await Self.send(one, clock, count: 10)
        #expect(!isEjected(one, 0, clock))
    }

    @Test("all down: attempts spread over every endpoint, and the first to recover serves at once")
    func allDown() async {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let upstream = Self.make(scripted, clock: clock)
        for address in Self.addresses { scripted.script(address, .error(.upstreamConnectFailed)) }
        await Self.send(upstream, clock, count: 30)
        scripted.resetCalls()
        await Self.send(upstream, clock, count: 30)
        // Every endpoint is down (ejected, or failing and kept by the cap): all are tried.
        #expect(Self.addresses.allSatisfy { scripted.calls($0) >= 5 }, "\(Self.addresses.map(scripted.calls))")
        // One comes back: after its first success it takes every request.
        scripted.script(Self.addresses[1], .status(200))
        var statuses = await Self.send(upstream, clock, count: 10)
        while statuses.first != 200 { statuses.removeFirst() }
        #expect(statuses.allSatisfy { $0 == 200 }, "\(statuses)")
        let after = await Self.send(upstream, clock, count: 20)
        #expect(after.allSatisfy { $0 == 200 })
    }

    @Test("a retry avoids the endpoint whose attempt just failed")
    func retryAvoidsFailedEndpoint() async throws {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        // Never ejected within the test's 20 failures: this test is about the choice alone.
        let upstream = Self.make(scripted, count: 2, clock: clock) {
            $0.balance = .random
            $0.outlierDetection.consecutiveFailures = 1000
        }
        scripted.script(Self.addresses[0], .status(503))
        for _ in 0..<20 {
            // Two attempts of one request share its stats, as the retry middleware's do.
            let stats = RequestStats()
            let first = try await upstream.send(Fixture.request(), context: Self.context(clock, stats: stats))
            if first.status.code == 503 {
                let second = try await upstream.send(Fixture.request(), context: Self.context(clock, stats: stats))
                #expect(second.status.code == 200)
            }
            #expect(stats.snapshot.extra.filter { $0.0 == "endpoint" }.count == 1)
            #expect(upstream.status(of: upstream.endpoints[0]) == .up)
        }
    }

    @Test("least_request prefers the endpoint with fewer requests in flight")
    func leastRequest() async throws {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let upstream = Self.make(scripted, count: 2, clock: clock) { $0.balance = .leastRequest }
        let gate = AsyncGate(), other = AsyncGate()
        scripted.script(Self.addresses[0], .held(gate))
        scripted.script(Self.addresses[1], .held(other))
        // Ten requests held, spread over both; then endpoint 1's finish and endpoint 0's stay.
        let held = Task {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<10 {
                    group.addTask { _ = try? await upstream.send(Fixture.request(), context: Self.context(clock)) }
                }
            }
        }
        try await Eventually.wait("ten requests held") {
            scripted.calls(Self.addresses[0]) + scripted.calls(Self.addresses[1]) == 10
        }
        let before = scripted.calls(Self.addresses[0])
        #expect(before >= 1)
        scripted.script(Self.addresses[0], .status(200))
        scripted.script(Self.addresses[1], .status(200))
        other.open()
        try await Eventually.wait("endpoint 1's requests done") {
            upstream.inFlight(1) == 0
        }
        await Self.send(upstream, clock, count: 20)
        #expect(scripted.calls(Self.addresses[0]) == before)
        gate.open()
        await held.value
    }

    @Test("past max_requests in flight: 503 upstream_overloaded at once, with Retry-After")
    func breaker() async throws {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let upstream = Self.make(scripted, count: 2, clock: clock) {
            var breaker = CircuitBreakerConfig()
            breaker.maxRequests = 4
            $0.circuitBreaker = breaker
        }
        let gate = AsyncGate()
        for address in Self.addresses.prefix(2) { scripted.script(address, .held(gate)) }
        let held = Task {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<4 {
                    group.addTask { _ = try? await upstream.send(Fixture.request(), context: Self.context(clock)) }
                }
            }
        }
        try await Eventually.wait("4 requests in flight") {
            scripted.calls(Self.addresses[0]) + scripted.calls(Self.addresses[1]) == 4
        }
        let (error, _) = await Fixture.expectGatewayError {
            try await upstream.send(Fixture.request(), context: Self.context(clock))
        }
        #expect(error?.kind == .upstreamOverloaded)
        #expect(error?.status.code == 503)
        #expect(error?.code == "upstream_overloaded")
        #expect(error?.headerFields[.retryAfter] == "1")
        gate.open()
        await held.value
        // Below the cap again.
        let response = try await upstream.send(Fixture.request(), context: Self.context(clock))
        #expect(response.status.code == 200)
    }

    @Test("max_pending: more requests than the endpoints' connections plus max_pending are refused")
    func breakerPending() async throws {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let upstream = Self.make(scripted, count: 2, clock: clock) {
            $0.maxConnections = 1
            var breaker = CircuitBreakerConfig()
            breaker.maxRequests = 100
            breaker.maxPending = 1
            $0.circuitBreaker = breaker
        }
        let gate = AsyncGate()
        for address in Self.addresses.prefix(2) { scripted.script(address, .held(gate)) }
        let held = Task {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<3 {
                    group.addTask { _ = try? await upstream.send(Fixture.request(), context: Self.context(clock)) }
                }
            }
        }
        try await Eventually.wait("3 requests in flight") {
            scripted.calls(Self.addresses[0]) + scripted.calls(Self.addresses[1]) == 3
        }
        let (error, _) = await Fixture.expectGatewayError {
            try await upstream.send(Fixture.request(), context: Self.context(clock))
        }
        #expect(error?.kind == .upstreamOverloaded)
        #expect(error?.message.contains("max_pending") == true)
        gate.open()
        await held.value
    }
}

@Suite("Resilience: metrics")
struct ResilienceMetricsTests {
    @Test("per endpoint: requests, failures by kind, ejections, ejected; per upstream: breaker refusals, all-down attempts")
    func counted() async throws {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let metrics = RecordingMetrics()
        let upstream = BalancedUpstreamTests.make(scripted, count: 2, clock: clock, metrics: metrics) {
            var breaker = CircuitBreakerConfig()
            breaker.maxRequests = 1
            $0.circuitBreaker = breaker
        }
        let (a, b) = (BalancedUpstreamTests.addresses[0], BalancedUpstreamTests.addresses[1])
        func value(_ label: String, _ endpoint: String, _ extra: [(String, String)] = []) -> Int64 {
            metrics.value(label, [("upstream", "orders"), ("endpoint", endpoint)] + extra)
        }
        scripted.script(a, .status(503))
        await BalancedUpstreamTests.send(upstream, clock, count: 10)
        #expect(value("portico_upstream_endpoint_requests_total", a) == 3)
        #expect(value("portico_upstream_endpoint_requests_total", b) == 7)
        #expect(value("portico_upstream_endpoint_failures_total", a, [("kind", "gateway_status")]) == 3)
        #expect(value("portico_upstream_endpoint_failures_total", b, [("kind", "gateway_status")]) == 0)
        #expect(value("portico_upstream_endpoint_ejections_total", a) == 1)
        #expect(value("portico_upstream_endpoint_ejected", a) == 1)
        #expect(value("portico_upstream_endpoint_healthy", a) == -1)

        // b fails too but the cap keeps it: all down, attempts spread over both.
        scripted.script(b, .error(.upstreamConnectionClosed))
        await BalancedUpstreamTests.send(upstream, clock, count: 10)
        let resets = value("portico_upstream_endpoint_failures_total", b, [("kind", "reset")])
        let allDown = metrics.value("portico_upstream_all_endpoints_down_total", [("upstream", "orders")])
        #expect(resets >= 3)
        #expect(allDown == 10 - 3)
        #expect(value("portico_upstream_endpoint_requests_total", a) + value("portico_upstream_endpoint_requests_total", b) == 20)
        #expect(value("portico_upstream_endpoint_ejections_total", b) == 0)

        // Every refusal of the breaker counts.
        let gate = AsyncGate()
        scripted.script(a, .held(gate))
        scripted.script(b, .held(gate))
        let held = Task { _ = try? await upstream.send(Fixture.request(), context: BalancedUpstreamTests.context(clock)) }
        try await Eventually.wait("one request in flight") { upstream.breakerInFlight == 1 }
        await BalancedUpstreamTests.send(upstream, clock, count: 4)
        #expect(metrics.value("portico_upstream_overloaded_total", [("upstream", "orders"), ("reason", "max_requests")]) == 4)
        gate.open()
        await held.value
    }
}

@Suite("Resilience: active health checks")
struct HealthCheckTests {
    @Test("failing checks make an endpoint unhealthy (no traffic); passing ones make it healthy again; checks are no requests")
    func unhealthyThenHealthy() async throws {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        let metrics = RecordingMetrics()
        let healthGauge = [("upstream", "orders"), ("endpoint", BalancedUpstreamTests.addresses[0])]
        let upstream = BalancedUpstreamTests.make(scripted, clock: clock, metrics: metrics) {
            var check = HealthCheckConfig(path: "/healthz")
            check.interval = .seconds(5)
            check.unhealthy = 2
            check.healthy = 2
            $0.healthCheck = check
        }
        // 503: a status that, answered to a request, is a failure for outlier detection too.
        scripted.script(BalancedUpstreamTests.addresses[0], .status(503))
        try await Eventually.wait("endpoint 0 unhealthy") {
            clock.advance(by: .seconds(1))
            return upstream.endpoints[0].currentHealth == .unhealthy
        }
        try await Eventually.wait("more failed checks than consecutive_failures") {
            clock.advance(by: .seconds(1))
            return upstream.endpoints[0].healthChecksDone >= 4
        }
        #expect(upstream.endpoints[1].currentHealth == .healthy)
        #expect(metrics.value("portico_upstream_endpoint_healthy", healthGauge) == 0)
        // Checks ran on every endpoint (each one a call on its client), yet none counted as a
        // request: no request or failure metric, nothing in the outlier record, although
        // endpoint 0 failed more checks than `consecutive_failures` (3). A failed check counted
        // as a request's failure would show as a last failure whatever came after it (an
        // ejection resets the streak, so the streak alone would not show it), and as `ejected`
        // (which outranks `unhealthy`) or `failing`.
        for (index, endpoint) in upstream.endpoints.enumerated() {
            let address = BalancedUpstreamTests.addresses[index]
            let labels = [("upstream", "orders"), ("endpoint", address)]
            #expect(scripted.calls(address) >= 1, "\(address) was never checked")
            #expect(metrics.value("portico_upstream_endpoint_requests_total", labels) == 0, "\(address)")
            for kind in EndpointFailure.allCases {
                #expect(metrics.value("portico_upstream_endpoint_failures_total", labels + [("kind", kind.name)]) == 0,
                        "\(address) \(kind.name)")
            }
            #expect(upstream.outlier.lastFailure(of: endpoint) == nil, "\(address)")
            #expect(endpoint.outlier.failuresInARow == 0, "\(address)")
            #expect(endpoint.outlier.ejections == 0, "\(address)")
            #expect(upstream.status(of: endpoint) == (index == 0 ? .unhealthy : .up), "\(address)")
        }
        scripted.resetCalls()
        await BalancedUpstreamTests.send(upstream, clock, count: 20)
        #expect(scripted.calls(BalancedUpstreamTests.addresses[0]) == 0)
        scripted.script(BalancedUpstreamTests.addresses[0], .status(204))
        try await Eventually.wait("endpoint 0 healthy") {
            clock.advance(by: .seconds(1))
            return upstream.endpoints[0].currentHealth == .healthy
        }
        #expect(metrics.value("portico_upstream_endpoint_healthy", healthGauge) == 1)
        scripted.resetCalls()
        await BalancedUpstreamTests.send(upstream, clock, count: 30)
        #expect(scripted.calls(BalancedUpstreamTests.addresses[0]) >= 5)
        await upstream.shutdown()
    }

    @Test("health_check parses; check refuses a bad path, range and timeout")
    func config() throws {
        let config = try load("""
            upstreams:
              u:
                endpoints: ["http://x:1", "http://y:1"]
                health_check: { path: /healthz, interval: 10s, timeout: 2s, healthy: 1, unhealthy: 4, expect: 200-299 }
            \(minimalRoute)
            """)
        let check = try #require(config.upstreams["u"]?.healthCheck)
        #expect(check.path == "/healthz")
        #expect(check.interval == .seconds(10))
        #expect(check.timeout == .seconds(2))
        #expect(check.healthy == 1)
        #expect(check.unhealthy == 4)
        #expect(check.expect == 200...299)
        #expect(diagnostics("""
            upstreams:
              u:
                url: "http://x:1"
                health_check: { path: healthz, interval: 1s, timeout: 2s, healthy: 0, expect: 300-200 }
            \(minimalRoute)
            """) == [
            #"portico.yaml:4 upstreams.u.health_check.path: expected an absolute path such as /healthz, got "healthz""#,
            "portico.yaml:4 upstreams.u.health_check.healthy: must be between 1 and 100, got 0",
            #"portico.yaml:4 upstreams.u.health_check.expect: expected a status or a range of statuses such as 200-399 (100 to 599), got "300-200""#,
            "portico.yaml:4 upstreams.u.health_check.timeout: must not be longer than interval (1.0 seconds)",
        ])
    }
}

extension EndpointState: Equatable {
    public static func == (lhs: EndpointState, rhs: EndpointState) -> Bool { lhs === rhs }
}
