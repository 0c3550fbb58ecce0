import HTTPTypes
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// `priority:` on a waiting rate limiter (issue #41): who holds which turn, as plain data.
@Suite("Rate limit priorities: the line as a value")
struct PriorityLineStateTests {
    let origin = ContinuousClock.now
    func at(_ ms: Int) -> ContinuousClock.Instant { origin.advanced(by: .milliseconds(ms)) }
    /// A deadline no turn below reaches.
    var late: ContinuousClock.Instant { at(60_000) }

    /// Each waiter's turn in milliseconds, by id, in the line's order.
    func turns(_ line: PriorityLineState, _ key: String = "k") -> [(UInt64, Int)] {
        (line.lines[key] ?? []).map { ($0.id, Int(origin.duration(to: $0.turn) / .milliseconds(1))) }
    }

    @Test("a higher-priority newcomer takes the earliest lower turn; the lower ones move one turn on, in their order")
    func higherGoesFirst() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "k", priority: .low, turn: at(100), deadline: late)
        _ = line.join(id: 2, key: "k", priority: .low, turn: at(200), deadline: late)
        let joined = line.join(id: 3, key: "k", priority: .high, turn: at(300), deadline: late)
        #expect(joined == .init(turn: at(100), refused: nil))
        #expect(turns(line).map(\.0) == [3, 1, 2])
        #expect(turns(line).map(\.1) == [100, 200, 300], "the same turns the store handed out, none added")
    }

    @Test("first come, first served within a priority: a second high request goes after the first")
    func fifoWithinAPriority() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "k", priority: .low, turn: at(100), deadline: late)
        _ = line.join(id: 2, key: "k", priority: .low, turn: at(200), deadline: late)
        _ = line.join(id: 3, key: "k", priority: .high, turn: at(300), deadline: late)
        _ = line.join(id: 4, key: "k", priority: .high, turn: at(400), deadline: late)
        #expect(turns(line).map(\.0) == [3, 4, 1, 2])
        // A low newcomer never goes before anyone.
        #expect(line.join(id: 5, key: "k", priority: .low, turn: at(500), deadline: late).turn == at(500))
        #expect(turns(line).map(\.0) == [3, 4, 1, 2, 5])
    }

    @Test("three levels: high before normal before low, whatever the order they came in")
    func threeLevels() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "k", priority: .low, turn: at(100), deadline: late)
        _ = line.join(id: 2, key: "k", priority: .normal, turn: at(200), deadline: late)
        _ = line.join(id: 3, key: "k", priority: .high, turn: at(300), deadline: late)
        _ = line.join(id: 4, key: "k", priority: .normal, turn: at(400), deadline: late)
        #expect(turns(line).map(\.0) == [3, 2, 4, 1])
        #expect(turns(line).map(\.1) == [100, 200, 300, 400])
    }

    @Test("a lower request whose next turn is past its deadline keeps its turn: nobody waits longer than it may")
    func deadlinesPinTurns() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "k", priority: .low, turn: at(100), deadline: at(150))
        _ = line.join(id: 2, key: "k", priority: .low, turn: at(200), deadline: late)
        let joined = line.join(id: 3, key: "k", priority: .high, turn: at(300), deadline: late)
        #expect(joined.turn == at(200))
        #expect(turns(line).map(\.0) == [1, 3, 2])
        // None of them may move: the newcomer keeps the turn the store gave it.
        var pinned = PriorityLineState()
        _ = pinned.join(id: 1, key: "k", priority: .low, turn: at(100), deadline: at(100))
        #expect(pinned.join(id: 2, key: "k", priority: .high, turn: at(200), deadline: late).turn == at(200))
        #expect(turns(pinned).map(\.0) == [1, 2])
    }

    @Test("keys are separate lines")
    func keysAreSeparate() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "a", priority: .low, turn: at(100), deadline: late)
        #expect(line.join(id: 2, key: "b", priority: .high, turn: at(300), deadline: late).turn == at(300))
        #expect(turns(line, "a").map(\.1) == [100])
    }

    @Test("overload: a high request with no turn of its own takes the last low waiter's place, which is refused")
    func overloadDisplacesTheLowest() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "k", priority: .normal, turn: at(100), deadline: late)
        _ = line.join(id: 2, key: "k", priority: .low, turn: at(200), deadline: late)
        _ = line.join(id: 3, key: "k", priority: .low, turn: at(300), deadline: late)
        _ = line.join(id: 4, key: "k", priority: .normal, turn: at(400), deadline: late)
        // Ids 4 and 1 are normal: id 4 displaced the lows when it came (ids 1, 4, 2, 3).
        #expect(turns(line).map(\.0) == [1, 4, 2, 3])
        let joined = line.join(id: 5, key: "k", priority: .high, turn: nil, deadline: late)
        #expect(joined == .init(turn: at(100), refused: 3), "the last of the lowest priority goes")
        #expect(turns(line).map(\.0) == [5, 1, 4, 2])
        #expect(turns(line).map(\.1) == [100, 200, 300, 400])
        #expect(line.count == 4)
    }

    @Test("overload: nobody lower to displace, or no lower turn within the newcomer's own wait: refused")
    func overloadWithNobodyToDisplace() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "k", priority: .high, turn: at(100), deadline: late)
        #expect(line.join(id: 2, key: "k", priority: .high, turn: nil, deadline: late) == .init(turn: nil, refused: nil))
        #expect(line.join(id: 3, key: "k", priority: .normal, turn: nil, deadline: late) == .init(turn: nil, refused: nil))
        var far = PriorityLineState()
        _ = far.join(id: 1, key: "k", priority: .low, turn: at(500), deadline: late)
        #expect(far.join(id: 2, key: "k", priority: .high, turn: nil, deadline: at(400)) == .init(turn: nil, refused: nil))
        #expect(far.count == 1, "nothing changed")
    }

    @Test("overload: a displaced chain stops where a waiter could not move without passing its deadline")
    func overloadRespectsDeadlines() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "k", priority: .low, turn: at(100), deadline: at(100))
        _ = line.join(id: 2, key: "k", priority: .low, turn: at(200), deadline: late)
        let joined = line.join(id: 3, key: "k", priority: .high, turn: nil, deadline: late)
        #expect(joined == .init(turn: at(200), refused: 2))
        #expect(turns(line).map(\.0) == [1, 3])
    }

    @Test("leaving frees the place; the line of a key with nobody left is dropped")
    func leaving() {
        var line = PriorityLineState()
        _ = line.join(id: 1, key: "k", priority: .low, turn: at(100), deadline: late)
        _ = line.join(id: 2, key: "k", priority: .low, turn: at(200), deadline: late)
        line.leave(id: 1, key: "k")
        #expect(turns(line).map(\.0) == [2])
        line.leave(id: 2, key: "k")
        line.leave(id: 2, key: "k")
        #expect(line.lines.isEmpty)
    }

    @Test("a priority header's value: high, normal, low in any case; anything else is normal")
    func headerValues() {
        #expect(WaitPriority(headerValue: "HIGH") == .high)
        #expect(WaitPriority(headerValue: "low") == .low)
        #expect(WaitPriority(headerValue: "Normal") == .normal)
        #expect(WaitPriority(headerValue: "urgent") == .normal)
        #expect(WaitPriority(headerValue: nil) == .normal)
    }
}

/// `priority:` through the middleware, on a manual clock.
@Suite("Rate limit priorities: waiting in order")
struct RateLimitPriorityTests {
    let clock = ManualClock()

    /// 2/s with a burst of 1: one token every 500 ms; `X-Priority` orders the waiters.
    func middleware(maxWait: Duration = .seconds(5)) -> RateLimitMiddleware {
        var config = RateLimitConfig(rate: Rate(count: 2, per: .seconds(1)), burst: 1)
        config.onLimit = .wait
        config.maxWait = maxWait
        config.priorityHeader = "x-priority"
        return RateLimitMiddleware(name: "vendor", config)
    }

    final class Arrivals: Sendable {
        private let list = Mutex<[String]>([])
        func append(_ value: String) { list.withLock { $0.append(value) } }
        var values: [String] { list.withLock { $0 } }
        var next: NextHandler {
            { request, _ in
                self.append(request.headerFields[HTTPField.Name("x-name")!] ?? "?")
                return GatewayResponse(status: .ok, body: "fine")
            }
        }
    }

    func request(_ name: String, _ priority: String?) -> GatewayRequest {
        var headers = [("x-name", name)]
        if let priority { headers.append(("x-priority", priority)) }
        return RetryFixture.request(headers: headers)
    }

    func outcome(_ limiter: RateLimitMiddleware, _ request: GatewayRequest, _ context: RequestContext,
                 _ upstream: Arrivals) async -> Result<GatewayResponse, any Error> {
        do { return .success(try await limiter.handle(request, context: context, next: upstream.next)) }
        catch { return .failure(error) }
    }

    @Test("a high request that came last reaches the upstream before the low ones waiting")
    func highBeforeEarlierLows() async throws {
        let limiter = middleware(), upstream = Arrivals()
        let context = RetryFixture.context(clock: clock)
        _ = try await limiter.handle(request("first", nil), context: context, next: upstream.next)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (index, (name, priority)) in [("low1", "low"), ("low2", "low"), ("high", "high")].enumerated() {
                group.addTask { _ = try await limiter.handle(request(name, priority), context: context, next: upstream.next) }
                await clock.waitForSleepers(index + 1)
            }
            for step in 2...4 {
                clock.advance(by: .milliseconds(500))
                // Displaced waiters wake at their old turn and sleep again until their new one.
                while upstream.values.count < step { await Task.yield() }
            }
            try await group.waitForAll()
        }
        #expect(upstream.values == ["first", "high", "low1", "low2"])
    }

    @Test("overload: with every turn within max_wait taken, a high request takes the last low one's, which gets 429 rate_limited")
    func highDisplacesLowUnderOverload() async throws {
        let limiter = middleware(maxWait: .seconds(1)), upstream = Arrivals()
        let context = RetryFixture.context(clock: clock)
        _ = try await limiter.handle(request("first", nil), context: context, next: upstream.next)
        async let low1 = limiter.handle(request("low1", "low"), context: context, next: upstream.next)   // due in 500 ms
        await clock.waitForSleepers(1)
        async let low2 = outcome(limiter, request("low2", "low"), context, upstream)
        await clock.waitForSleepers(2)
        // Another low request's turn would be due in 1.5 s: past max_wait, refused as without
        // priorities (nobody lower to displace).
        await #expect(throws: GatewayError.self) {
            _ = try await limiter.handle(request("low3", "low"), context: context, next: upstream.next)
        }
        #expect(limiter.queue.count == 2)
        async let high = limiter.handle(request("high", "high"), context: context, next: upstream.next)
        await clock.waitForSleepers(3)
        clock.advance(by: .milliseconds(500))
        _ = try await high
        #expect(upstream.values == ["first", "high"])
        clock.advance(by: .milliseconds(500))
        _ = try await low1
        let displaced = await low2
        guard case .failure(let error as GatewayError) = displaced else {
            Issue.record("the displaced request was served: \(displaced)")
            return
        }
        #expect(error.code == "rate_limited")
        #expect(error.headerFields[.retryAfter] != nil)
        #expect(upstream.values == ["first", "high", "low1"])
        #expect(limiter.queue.count == 0)
        #expect(limiter.queue.line.count == 0)
    }
}
