import HTTPTypes
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// A `next` whose attempts run as `script(n)` says (n from 1), which may await; records the
/// attempts that were cancelled while they ran.
final class RacingNext: Sendable {
    typealias Script = @Sendable (Int, RequestContext) async throws -> GatewayResponse
    private struct State {
        var calls = 0
        var cancelled: [Int] = []
    }
    private let state = Mutex(State())
    let script: Script

    init(_ script: @escaping Script) { self.script = script }

    var calls: Int { state.withLock { $0.calls } }
    var cancelled: [Int] { state.withLock { $0.cancelled } }

    var handler: NextHandler {
        { [self] _, context in
            let attempt = state.withLock { $0.calls += 1; return $0.calls }
            do {
                return try await script(attempt, context)
            } catch let error as CancellationError {
                state.withLock { $0.cancelled.append(attempt) }
                throw error
            }
        }
    }

    /// Until cancelled, on the test's clock (which never gets there by itself).
    static func hang(_ clock: ManualClock) async throws -> GatewayResponse {
        try await clock.sleep(until: clock.now.advanced(by: .seconds(86_400)))
        return RetryFixture.response(200)
    }
}

@Suite("Retry: hedged attempts", .timeLimit(.minutes(1)))
struct HedgeMiddlewareTests {
    let clock = ManualClock()

    func middleware(after: HedgeConfig.Delay = .fixed(.milliseconds(50)), maxExtra: Int = 1,
                    configure: (inout RetryConfig) -> Void = { _ in }, budget: RetryBudget? = nil) -> RetryMiddleware {
        var config = RetryFixture.config { $0.hedge = HedgeConfig(after: after, min: .milliseconds(20), maxExtra: maxExtra) }
        configure(&config)
        return RetryMiddleware(config, budget: budget, random: { 0 })
    }

    @Test("an attempt without a head after the delay is hedged; the hedge's answer wins and the first is cancelled")
    func hedgeWins() async throws {
        let clock = clock
        let next = RacingNext { attempt, _ in
            attempt == 1 ? try await RacingNext.hang(clock) : RetryFixture.response(200, headers: [("x-attempt", "2")])
        }
        let context = RetryFixture.context(clock: clock)
        let middleware = middleware()
        let task = Task { try await middleware.handle(RetryFixture.request(), context: context, next: next.handler) }
        await clock.waitForSleepers(2)  // the first attempt and the hedge timer
        #expect(next.calls == 1)
        clock.advance(by: .milliseconds(50))
        let response = try await task.value
        #expect(response.headerFields[HTTPField.Name("x-attempt")!] == "2")
        #expect(next.calls == 2)
        #expect(next.cancelled == [1])
        let stats = context.stats.snapshot
        #expect(stats[RetryMiddleware.Tally.self] == RetryMiddleware.HedgeTally(sent: 1, won: 1, cancelled: 1, winner: 2))
        #expect(stats.extra.contains { $0 == ("hedges", "1") } && stats.extra.contains { $0 == ("hedge_winner", "2") })
    }

    @Test("an answer before the delay sends no hedge")
    func fastAnswerNoHedge() async throws {
        let next = RacingNext { _, _ in RetryFixture.response(200) }
        let context = RetryFixture.context(clock: clock)
        let response = try await middleware().handle(RetryFixture.request(), context: context, next: next.handler)
        #expect(response.status == .ok && next.calls == 1)
        #expect(context.stats.snapshot[RetryMiddleware.Tally.self] == nil)
        #expect(clock.sleeperCount == 0)  // the hedge timer was cancelled
    }

    @Test("the first attempt's answer wins over a hedge still running, which is cancelled")
    func firstWins() async throws {
        let clock = clock
        let release = AsyncGate()
        let next = RacingNext { attempt, _ in
            if attempt == 1 {
                await release.wait()
                return RetryFixture.response(200, headers: [("x-attempt", "1")])
            }
            return try await RacingNext.hang(clock)
        }
        let context = RetryFixture.context(clock: clock)
        let middleware = middleware()
        let task = Task { try await middleware.handle(RetryFixture.request(), context: context, next: next.handler) }
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(50))
        try await Eventually.wait("the hedge is sent") { next.calls == 2 && clock.sleeperCount == 1 }
        release.open()
        let response = try await task.value
        #expect(response.headerFields[HTTPField.Name("x-attempt")!] == "1")
        #expect(next.cancelled == [2])
        #expect(context.stats.snapshot[RetryMiddleware.Tally.self] == RetryMiddleware.HedgeTally(sent: 1, won: 0, cancelled: 1, winner: 1))
    }

    @Test("a retryable answer does not win while the other attempt runs")
    func retryableWaits() async throws {
        let clock = clock
        let release = AsyncGate()
        let next = RacingNext { attempt, _ in
            if attempt == 1 {
                await release.wait()
                return RetryFixture.response(200, headers: [("x-attempt", "1")])
            }
            return RetryFixture.response(503)
        }
        let context = RetryFixture.context(clock: clock)
        let middleware = middleware()
        let task = Task { try await middleware.handle(RetryFixture.request(), context: context, next: next.handler) }
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(50))
        try await Eventually.wait("the hedge is answered") { next.calls == 2 }
        release.open()
        let response = try await task.value
        #expect(response.status == .ok)
        #expect(next.cancelled.isEmpty)
    }

    @Test("POST is never hedged (nor retried) unless listed")
    func postNeverHedged() async throws {
        let release = AsyncGate()
        let next = RacingNext { _, _ in
            await release.wait()
            return RetryFixture.response(200)
        }
        let middleware = middleware()
        let clock = clock
        let task = Task { try await middleware.handle(RetryFixture.request(.post, body: "order"), context: RetryFixture.context(clock: clock), next: next.handler) }
        try await Eventually.wait("the attempt runs") { next.calls == 1 }
        clock.advance(by: .seconds(1))
        #expect(clock.sleeperCount == 0 && next.calls == 1)
        release.open()
        _ = try await task.value
        #expect(next.calls == 1)
    }

    @Test("a streamed request body is never hedged")
    func streamedNeverHedged() async throws {
        let release = AsyncGate()
        let next = RacingNext { _, _ in
            await release.wait()
            return RetryFixture.response(200)
        }
        let (body, _) = MiddlewareStreamFixture.body()
        var request = RetryFixture.request(.put)
        request.body = body
        let middleware = middleware()
        let clock = clock
        let task = Task { try await middleware.handle(request, context: RetryFixture.context(clock: clock), next: next.handler) }
        try await Eventually.wait("the attempt runs") { next.calls == 1 }
        clock.advance(by: .seconds(1))
        #expect(clock.sleeperCount == 0 && next.calls == 1)
        release.open()
        _ = try await task.value
        #expect(next.calls == 1)
    }

    @Test("with the retry budget spent no hedge goes out")
    func budgetExhausted() async throws {
        let clock = clock
        let release = AsyncGate()
        let next = RacingNext { _, _ in
            await release.wait()
            return RetryFixture.response(200)
        }
        let context = RetryFixture.context(clock: clock)
        let middleware = middleware(budget: RetryBudget(ratio: 0, minPerSecond: 0))
        let task = Task { try await middleware.handle(RetryFixture.request(), context: context, next: next.handler) }
        await clock.waitForSleepers(1)
        clock.advance(by: .milliseconds(50))
        try await Eventually.wait("the hedge is refused") { context.stats.snapshot.extra.contains { $0 == ("hedge_stopped", "budget") } }
        #expect(next.calls == 1)
        release.open()
        _ = try await task.value
        #expect(next.calls == 1)
        #expect(context.stats.snapshot[RetryMiddleware.Tally.self] == nil)
    }

    @Test("max_extra hedges go out, one delay apart, to the first answer")
    func maxExtra() async throws {
        let clock = clock
        let next = RacingNext { attempt, _ in
            attempt < 3 ? try await RacingNext.hang(clock) : RetryFixture.response(200)
        }
        let context = RetryFixture.context(clock: clock)
        let middleware = middleware(maxExtra: 2)
        let task = Task { try await middleware.handle(RetryFixture.request(), context: context, next: next.handler) }
        await clock.waitForSleepers(2)
        clock.advance(by: .milliseconds(50))
        await clock.waitForSleepers(3)  // two attempts and the next timer
        #expect(next.calls == 2)
        clock.advance(by: .milliseconds(50))
        _ = try await task.value
        #expect(next.calls == 3)
        #expect(Set(next.cancelled) == [1, 2])
        #expect(context.stats.snapshot[RetryMiddleware.Tally.self] == RetryMiddleware.HedgeTally(sent: 2, won: 1, cancelled: 2, winner: 3))
    }

    @Test("after: pNN hedges only once the route has enough samples, after their percentile (never below min)")
    func percentileDelay() async throws {
        let clock = clock
        let middleware = middleware(after: .percentile(90))
        #expect(middleware.hedgeDelay(route: "orders", now: clock.now) == nil)
        for ms in 1...20 { middleware.recordLatency(route: "orders", since: clock.now, now: clock.now.advanced(by: .milliseconds(ms * 10))) }
        clock.advance(by: .seconds(1))
        #expect(middleware.hedgeDelay(route: "orders", now: clock.now) == .milliseconds(180))
        #expect(middleware.hedgeDelay(route: "other", now: clock.now) == nil)
        let fast = self.middleware(after: .percentile(50))
        for _ in 1...20 { fast.recordLatency(route: "orders", since: clock.now, now: clock.now.advanced(by: .milliseconds(1))) }
        clock.advance(by: .seconds(1))
        #expect(fast.hedgeDelay(route: "orders", now: clock.now) == .milliseconds(20))
        // A fixed delay is never below min either.
        #expect(self.middleware(after: .fixed(.milliseconds(5))).hedgeDelay(route: "orders", now: clock.now) == .milliseconds(20))
    }

    @Test("with hedge and attempts: 1 a failure is not retried, a slow attempt still hedged")
    func hedgeWithoutRetries() async throws {
        let clock = clock
        let next = RacingNext { attempt, _ in
            attempt == 1 ? try await RacingNext.hang(clock) : RetryFixture.response(503)
        }
        let middleware = middleware(configure: { $0.attempts = 1 })
        let task = Task { try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler) }
        await clock.waitForSleepers(2)
        clock.advance(by: .milliseconds(50))
        try await Eventually.wait("the hedge answered") { next.calls == 2 }
        // The 503 waits for the first attempt, which hangs: the request's caller cancels.
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
        #expect(next.calls == 2)
    }
}
