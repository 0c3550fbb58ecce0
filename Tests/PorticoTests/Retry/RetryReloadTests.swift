@testable import Portico
import PorticoTesting
import Testing

@Suite("Retry budget across reloads")
struct RetryReloadTests {
    /// At most 10 retries per 10-second window, whatever the traffic; no waiting between attempts.
    static func config(attempts: Int = 3) -> PorticoConfig {
        var retry = RetryConfig()
        retry.attempts = attempts
        retry.budget = 0
        retry.minRetriesPerSecond = 1
        retry.backoffBase = .zero
        retry.backoffCap = .zero
        var config = PorticoConfig()
        config.middleware["retry"] = .retry(retry)
        config.routes = [RouteConfig(name: "ping", match: .init(path: "/ping"), direct: .init(body: "pong"),
                                     middleware: ["retry"])]
        return config
    }

    /// Sends a request whose first attempt fails with 503 and returns how many attempts it took.
    static func attempts(through runtime: GatewayRuntime, clock: ManualClock) async throws -> Int {
        let retry = try #require(runtime.middleware["retry"] as? RetryMiddleware)
        let next = ScriptedNext { attempt in RetryFixture.response(attempt == 1 ? 503 : 200) }
        _ = try await retry.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
        return next.calls
    }

    @Test("a budget spent before a reload with unchanged settings stays spent; changed settings start a new one")
    func keepsBudget() async throws {
        let clock = ManualClock()
        let logger = RetryFixture.logger
        let first = try GatewayRuntime(config: Self.config(), logger: logger, clock: clock)
        #expect(try await Self.attempts(through: first, clock: clock) == 2)
        let budget = try #require(first.middleware["retry"] as? RetryMiddleware).budget
        while budget.tryAcquireRetry(at: clock.now) {}
        #expect(try await Self.attempts(through: first, clock: clock) == 1)

        let same = try GatewayRuntime(config: Self.config(), logger: logger, clock: clock, previous: first)
        #expect(try await Self.attempts(through: same, clock: clock) == 1)

        let changed = try GatewayRuntime(config: Self.config(attempts: 4), logger: logger, clock: clock, previous: same)
        #expect(try await Self.attempts(through: changed, clock: clock) == 2)
        for runtime in [first, same, changed] {
            await runtime.shutdown()
        }
    }

    @Test("a reload with unchanged settings keeps each route's latency estimate for hedge: after: pNN")
    func keepsLatencies() async throws {
        let clock = ManualClock()
        var config = Self.config()
        config.middleware["retry"] = .retry(RetryConfig.hedged(after: .percentile(90)))
        let first = try GatewayRuntime(config: config, logger: RetryFixture.logger, clock: clock)
        let retry = try #require(first.middleware["retry"] as? RetryMiddleware)
        for _ in 0..<20 { retry.recordLatency(route: "ping", since: clock.now, now: clock.now.advanced(by: .milliseconds(40))) }
        clock.advance(by: .seconds(1))
        #expect(retry.hedgeDelay(route: "ping", now: clock.now) == .milliseconds(40))
        let same = try GatewayRuntime(config: config, logger: RetryFixture.logger, clock: clock, previous: first)
        let kept = try #require(same.middleware["retry"] as? RetryMiddleware)
        #expect(kept.hedgeDelay(route: "ping", now: clock.now) == .milliseconds(40))
        for runtime in [first, same] {
            await runtime.shutdown()
        }
    }
}

extension RetryConfig {
    static func hedged(after: HedgeConfig.Delay) -> RetryConfig {
        var retry = RetryConfig()
        retry.hedge = HedgeConfig(after: after)
        return retry
    }
}
