import HTTPTypes
import Portico
import PorticoTesting
import Synchronization
import Testing

/// `on_limit: wait` (issue #41): a request over the limit waits for its token instead of a 429.
@Suite("Rate limit: waiting instead of refusing")
struct RateLimitWaitingTests {
    let clock = ManualClock()

    /// 2/s with a burst of 1: one token every 500 ms.
    func middleware(maxWait: Duration = .seconds(2), maxWaiting: Int = 100,
                    _ configure: (inout RateLimitConfig) -> Void = { _ in }) -> RateLimitMiddleware {
        var config = RateLimitConfig(rate: Rate(count: 2, per: .seconds(1)), burst: 1)
        config.onLimit = .wait
        config.maxWait = maxWait
        config.maxWaiting = maxWaiting
        configure(&config)
        return RateLimitMiddleware(name: "vendor", config)
    }

    /// An upstream that counts what reaches it.
    final class Upstream: Sendable {
        let calls = Atomic<Int>(0)
        var next: NextHandler {
            { _, _ in
                self.calls.wrappingAdd(1, ordering: .relaxed)
                return GatewayResponse(status: .ok, body: "fine")
            }
        }
        var count: Int { calls.load(ordering: .relaxed) }
    }

    final class Arrivals: Sendable {
        private let list = Mutex<[Int]>([])
        func append(_ value: Int) { list.withLock { $0.append(value) } }
        var values: [Int] { list.withLock { $0 } }
    }

    @Test("over the limit a request waits for its token and then goes, instead of a 429")
    func waitsThenGoes() async throws {
        let limiter = middleware(), upstream = Upstream()
        let context = RetryFixture.context(clock: clock)
        _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        async let second = limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        await clock.waitForSleepers(1)
        #expect(upstream.count == 1, "the waiting request has not reached the upstream")
        #expect(limiter.queue.count == 1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .milliseconds(500)))
        clock.advance(by: .milliseconds(500))
        let response = try await second
        #expect(response.status == .ok)
        #expect(upstream.count == 2)
        #expect(limiter.queue.count == 0)
    }

    @Test("waiting requests go first come, first served, one token interval apart")
    func firstComeFirstServed() async throws {
        let limiter = middleware(), upstream = Upstream()
        let context = RetryFixture.context(clock: clock)
        _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        let order = Arrivals()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 1...3 {
                group.addTask {
                    _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
                    order.append(index)
                }
                await clock.waitForSleepers(index)
            }
            let start = clock.now
            #expect(clock.nextDeadline == start.advanced(by: .milliseconds(500)))
            for step in 1...3 {
                clock.advance(by: .milliseconds(500))
                while order.values.count < step { await Task.yield() }
            }
            try await group.waitForAll()
        }
        #expect(order.values == [1, 2, 3])
    }

    @Test("a wait longer than max_wait is refused at once with Retry-After, not after waiting")
    func tooLongIsRefusedAtOnce() async throws {
        let limiter = middleware(maxWait: .milliseconds(700)), upstream = Upstream()
        let context = RetryFixture.context(clock: clock)
        _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        async let second = limiter.handle(RetryFixture.request(), context: context, next: upstream.next)   // due in 500 ms
        await clock.waitForSleepers(1)
        // The third's token is due in 1 s: past max_wait.
        let error = await #expect(throws: GatewayError.self) {
            _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        }
        #expect(error?.code == "rate_limited")
        #expect(error?.headerFields[.retryAfter] == "1")
        #expect(clock.sleeperCount == 1, "the refused request never waited")
        clock.advance(by: .milliseconds(500))
        _ = try await second
        #expect(upstream.count == 2)
    }

    @Test("a request never waits past its own deadline")
    func deadlineBoundsTheWait() async throws {
        let limiter = middleware(maxWait: .seconds(5)), upstream = Upstream()
        _ = try await limiter.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: upstream.next)
        let error = await #expect(throws: GatewayError.self) {
            _ = try await limiter.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock, deadlineIn: .milliseconds(300)),
                                         next: upstream.next)
        }
        #expect(error?.status == .tooManyRequests)
        #expect(clock.sleepsStarted == 0)
    }

    @Test("a full queue refuses at once; max_waiting bounds the requests waiting")
    func fullQueueRefuses() async throws {
        let limiter = middleware(maxWaiting: 1), upstream = Upstream()
        let context = RetryFixture.context(clock: clock)
        _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        async let second = limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        await clock.waitForSleepers(1)
        let error = await #expect(throws: GatewayError.self) {
            _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        }
        #expect(error?.code == "rate_limited")
        #expect(clock.sleeperCount == 1)
        // The refused one gave its slot back: the next request waits one interval after the second, not two.
        clock.advance(by: .milliseconds(500))
        _ = try await second
        async let fourth = limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .milliseconds(500)))
        clock.advance(by: .milliseconds(500))
        _ = try await fourth
        #expect(upstream.count == 3)
    }

    @Test("a client that leaves while waiting never reaches the upstream, and frees its place and token")
    func leavingClientFreesItsPlace() async throws {
        let limiter = middleware(), upstream = Upstream()
        let context = RetryFixture.context(clock: clock)
        _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        let leaving = Task { try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next) }
        await clock.waitForSleepers(1)
        #expect(limiter.queue.count == 1)
        leaving.cancel()
        await #expect(throws: CancellationError.self) { _ = try await leaving.value }
        #expect(limiter.queue.count == 0)
        #expect(upstream.count == 1)
        // Its token is back: the next request waits for the slot the leaver held (500 ms), not the one after.
        async let next = limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .milliseconds(500)))
        clock.advance(by: .milliseconds(500))
        _ = try await next
        #expect(upstream.count == 2)
    }

    /// An endpoint calling a test's `next`: a chain's upstream.
    struct Endpoint: Responder {
        let next: NextHandler
        func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
            try await next(request, context)
        }
    }

    @Test("decided on the server's thread, a request whose token is due later keeps it and its place, and its task is to start then; a wait cut short gives both back")
    func deferredStart() async throws {
        let limiter = middleware(maxWaiting: 2), upstream = Upstream()
        let chain = MiddlewareChain([limiter], endpoint: Endpoint(next: upstream.next))
        func attempt() throws -> (RequestContext, DeferredStart.Value?) {
            let context = RetryFixture.context(clock: clock)
            #expect(try chain.respondImmediately(to: RetryFixture.request(), context: context) == nil, "an upstream needs a task")
            return (context, context.stats.update { $0[DeferredStart.self] })
        }
        let (first, none) = try attempt()
        #expect(none == nil, "the burst's token goes at once")
        #expect(try await chain.respond(to: RetryFixture.request(), context: first).status == .ok)

        let (second, secondStart) = try attempt()
        let (third, thirdStart) = try attempt()
        #expect(secondStart?.at == clock.now.advanced(by: .milliseconds(500)))
        #expect(thirdStart?.at == clock.now.advanced(by: .seconds(1)), "each keeps the token it reserved: first come, first served")
        #expect(limiter.queue.count == 2)
        let error = #expect(throws: GatewayError.self, "max_waiting: 2 are waiting") { _ = try attempt() }
        #expect(error?.code == "rate_limited")
        #expect(clock.sleepsStarted == 0, "nothing sleeps on the server's thread")

        clock.advance(by: .milliseconds(500))
        secondStart?.began(false)
        #expect(limiter.queue.count == 1)
        let served = try await chain.respond(to: RetryFixture.request(), context: second)
        #expect(served.status == .ok && upstream.count == 2)
        #expect(second.stats.update { $0.extra.contains { $0.0 == "ratelimit_wait" } }, "the wait is in the access log")

        // The third's client leaves: the task starts cancelled, gives the token back, goes no further.
        thirdStart?.began(true)
        #expect(limiter.queue.count == 0)
        let leaving = Task { try await chain.respond(to: RetryFixture.request(), context: third) }
        leaving.cancel()
        await #expect(throws: CancellationError.self) { _ = try await leaving.value }
        #expect(upstream.count == 2, "a request whose wait was cut short never reaches the upstream")
        let (_, fourthStart) = try attempt()
        #expect(fourthStart?.at == clock.now.advanced(by: .milliseconds(500)), "the slot the third gave back")
    }

    /// A step that always needs the task (as `retry` or `auth` does).
    struct NeedsTask: Middleware {
        func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
            try await next(request, context)
        }
    }

    @Test("the gateway looks for a deferred start only on chains whose limit can set one, reached at once")
    func chainsThatDefer() {
        let endpoint = Endpoint(next: Upstream().next)
        #expect(MiddlewareChain([middleware()], endpoint: endpoint).defersStart)
        #expect(!MiddlewareChain([middleware { $0.onLimit = .reject }], endpoint: endpoint).defersStart)
        #expect(!MiddlewareChain([middleware { $0.priorityHeader = "X-Priority" }], endpoint: endpoint).defersStart,
                "priorities wait in the task's line")
        #expect(!MiddlewareChain([NeedsTask(), middleware()], endpoint: endpoint).defersStart,
                "behind a step that needs the task, the limit never runs at once")
        #expect(MiddlewareChain([middleware(), NeedsTask()], endpoint: endpoint).defersStart)
    }

    @Test("with priority: a request decided on the server's thread still waits in the bucket's line, in its task")
    func priorityWaitsInTheTask() async throws {
        let limiter = middleware { $0.priorityHeader = "X-Priority" }, upstream = Upstream()
        let chain = MiddlewareChain([limiter], endpoint: Endpoint(next: upstream.next))
        let first = RetryFixture.context(clock: clock)
        #expect(try chain.respondImmediately(to: RetryFixture.request(), context: first) == nil)
        _ = try await chain.respond(to: RetryFixture.request(), context: first)
        let second = RetryFixture.context(clock: clock)
        #expect(try chain.respondImmediately(to: RetryFixture.request(), context: second) == nil)
        #expect(second.stats.update { $0[DeferredStart.self] } == nil)
        #expect(limiter.queue.count == 0, "no place taken: the line decides in the task")
        async let waited = chain.respond(to: RetryFixture.request(), context: second)
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .milliseconds(500)), "its token was given back and taken again")
        clock.advance(by: .milliseconds(500))
        #expect(try await waited.status == .ok)
    }

    @Test("on_limit: reject (the default) still refuses at once")
    func rejectStillRefuses() async throws {
        let limiter = middleware { $0.onLimit = .reject }, upstream = Upstream()
        let context = RetryFixture.context(clock: clock)
        _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        await #expect(throws: GatewayError.self) {
            _ = try await limiter.handle(RetryFixture.request(), context: context, next: upstream.next)
        }
        #expect(clock.sleepsStarted == 0)
    }
}
