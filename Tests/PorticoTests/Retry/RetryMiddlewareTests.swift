import Foundation
import HTTPTypes
import Portico
import PorticoTesting
import Testing

@Suite("Retry middleware")
struct RetryMiddlewareTests {
    let clock = ManualClock()

    @Test("a 503 twice and then a 200 takes three attempts and returns the 200")
    func retriesUntilSuccess() async throws {
        let next = ScriptedNext { $0 <= 2 ? RetryFixture.response(503) : RetryFixture.response(200) }
        let middleware = RetryMiddleware(RetryFixture.config(), random: { 0 })
        let response = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
        #expect(response.status.code == 200)
        #expect(next.calls == 3)
    }

    @Test("attempts bound the total: the last failure is returned")
    func exhaustsAttempts() async throws {
        let next = ScriptedNext { _ in RetryFixture.response(502) }
        let middleware = RetryMiddleware(RetryFixture.config { $0.attempts = 4 }, random: { 0 })
        let response = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
        #expect(response.status.code == 502)
        #expect(next.calls == 4)
    }

    @Test("POST is not retried by default, and is when listed")
    func postOnlyWhenListed() async throws {
        let next = ScriptedNext { _ in RetryFixture.response(503) }
        let middleware = RetryMiddleware(RetryFixture.config(), random: { 0 })
        let response = try await middleware.handle(RetryFixture.request(.post, body: "order"), context: RetryFixture.context(clock: clock), next: next.handler)
        #expect(response.status.code == 503)
        #expect(next.calls == 1)

        let widened = ScriptedNext { _ in RetryFixture.response(503) }
        let post = RetryMiddleware(RetryFixture.config { $0.methods = ["GET", "POST"] }, random: { 0 })
        _ = try await post.handle(RetryFixture.request(.post, body: "order"), context: RetryFixture.context(clock: clock), next: widened.handler)
        #expect(widened.calls == 3)
    }

    @Test("statuses not listed are returned at once; 429 only when listed")
    func statusSelection() async throws {
        for status in [200, 404, 429, 500] {
            let next = ScriptedNext { _ in RetryFixture.response(status) }
            let middleware = RetryMiddleware(RetryFixture.config(), random: { 0 })
            _ = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
            #expect(next.calls == 1, "status \(status)")
        }
        let next = ScriptedNext { _ in RetryFixture.response(429) }
        let middleware = RetryMiddleware(RetryFixture.config { $0.on.append(.status(429)) }, random: { 0 })
        _ = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
        #expect(next.calls == 3)
    }

    @Test("connect errors, timeouts and resets are retried; TLS and protocol errors are not")
    func errorSelection() async throws {
        let retried: [UpstreamError] = [.connectFailed("refused"), .connectTimeout, .timeout, .connectionClosed("reset")]
        for failure in retried {
            let next = ScriptedNext { attempt in
                if attempt == 1 { throw failure.gatewayError(upstream: "orders") }
                return RetryFixture.response(200)
            }
            let middleware = RetryMiddleware(RetryFixture.config(), random: { 0 })
            let response = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
            #expect(response.status.code == 200, "\(failure)")
            #expect(next.calls == 2, "\(failure)")
        }
        let final: [UpstreamError] = [.tls("bad certificate"), .protocolError("garbage"), .responseTooLarge(limit: 1)]
        for failure in final {
            let next = ScriptedNext { _ in throw failure.gatewayError(upstream: "orders") }
            let middleware = RetryMiddleware(RetryFixture.config(), random: { 0 })
            await #expect(throws: GatewayError.self) {
                _ = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
            }
            #expect(next.calls == 1, "\(failure)")
        }
        // Only the listed conditions count.
        let next = ScriptedNext { _ in throw UpstreamError.timeout.gatewayError(upstream: "orders") }
        let middleware = RetryMiddleware(RetryFixture.config { $0.on = [.connectError] }, random: { 0 })
        await #expect(throws: GatewayError.self) {
            _ = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
        }
        #expect(next.calls == 1)
    }

    @Test("the classification follows what the transports throw")
    func classification() {
        #expect(RetryMiddleware.classify(UpstreamError.connectFailed("x").gatewayError(upstream: "u")) == .connectError)
        #expect(RetryMiddleware.classify(UpstreamError.connectTimeout.gatewayError(upstream: "u")) == .timeout)
        #expect(RetryMiddleware.classify(UpstreamError.timeout.gatewayError(upstream: "u")) == .timeout)
        #expect(RetryMiddleware.classify(UpstreamError.connectionClosed("x").gatewayError(upstream: "u")) == .reset)
        #expect(RetryMiddleware.classify(UpstreamError.tls("x").gatewayError(upstream: "u")) == nil)
        #expect(RetryMiddleware.classify(GatewayError.badRequest("x")) == nil)
        #expect(RetryMiddleware.classify(CancellationError()) == nil)
    }

    @Test("backoff sleeps on the injected clock with full jitter")
    func backoffUsesClock() async throws {
        let next = ScriptedNext { $0 <= 2 ? RetryFixture.response(503) : RetryFixture.response(200) }
        let middleware = RetryMiddleware(RetryFixture.config { $0.backoffBase = .milliseconds(100); $0.backoffCap = .seconds(1) },
                                         random: { 0.5 })
        let start = clock.now
        let context = RetryFixture.context(clock: clock)
        let task = Task { try await middleware.handle(RetryFixture.request(), context: context, next: next.handler) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == start.advanced(by: .milliseconds(50)))   // 0.5 × 100ms
        #expect(next.calls == 1)
        clock.advanceToNextDeadline()
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == start.advanced(by: .milliseconds(150)))  // + 0.5 × 200ms
        clock.advanceToNextDeadline()
        let response = try await task.value
        #expect(response.status.code == 200)
        #expect(next.calls == 3)
    }

    @Test("Retry-After in seconds is waited for")
    func retryAfterSeconds() async throws {
        let next = ScriptedNext { $0 == 1 ? RetryFixture.response(503, headers: [("Retry-After", "2")]) : RetryFixture.response(200) }
        let middleware = RetryMiddleware(RetryFixture.config(), random: { 0 })
        let start = clock.now
        let context = RetryFixture.context(clock: clock)
        let task = Task { try await middleware.handle(RetryFixture.request(), context: context, next: next.handler) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == start.advanced(by: .seconds(2)))
        clock.advance(by: .seconds(2))
        #expect(try await task.value.status.code == 200)
        #expect(next.calls == 2)
    }

    @Test("Retry-After as an HTTP-date is measured on the clock's wall time")
    func retryAfterDate() async throws {
        let at = HTTPDateFixture.imf(clock.wallNow.addingTimeInterval(3))
        let next = ScriptedNext { $0 == 1 ? RetryFixture.response(503, headers: [("Retry-After", at)]) : RetryFixture.response(200) }
        let middleware = RetryMiddleware(RetryFixture.config(), random: { 0 })
        let start = clock.now
        let context = RetryFixture.context(clock: clock)
        let task = Task { try await middleware.handle(RetryFixture.request(), context: context, next: next.handler) }
        await clock.waitForSleepers(1)
        let wait = start.duration(to: try #require(clock.nextDeadline))   // wall time has sub-second parts
        #expect(wait > .seconds(2) && wait <= .seconds(3))
        clock.advanceToNextDeadline()
        #expect(try await task.value.status.code == 200)
    }

    @Test("a Retry-After beyond max_retry_after returns the response at once")
    func retryAfterTooLong() async throws {
        let next = ScriptedNext { _ in RetryFixture.response(503, headers: [("Retry-After", "120")]) }
        let middleware = RetryMiddleware(RetryFixture.config { $0.maxRetryAfter = .seconds(5) }, random: { 0 })
        let context = RetryFixture.context(clock: clock)
        let response = try await middleware.handle(RetryFixture.request(), context: context, next: next.handler)
        #expect(response.status.code == 503)
        #expect(response.headerFields[.retryAfter] == "120")
        #expect(next.calls == 1)
        #expect(clock.sleepsStarted == 0)
        #expect(context.stats.snapshot.extra.contains { $0 == ("retry_stopped", "retry_after") })
    }

    @Test("a garbage Retry-After falls back to backoff")
    func retryAfterGarbage() async throws {
        let next = ScriptedNext { $0 == 1 ? RetryFixture.response(503, headers: [("Retry-After", "soon")]) : RetryFixture.response(200) }
        let middleware = RetryMiddleware(RetryFixture.config(), random: { 0 })
        let response = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: next.handler)
        #expect(response.status.code == 200)
        #expect(next.calls == 2)
    }

    @Test("each attempt gets per_try_timeout as its deadline, inside the overall deadline")
    func perTryTimeout() async throws {
        let next = ScriptedNext { attempt in
            if attempt == 1 { throw UpstreamError.timeout.gatewayError(upstream: "orders") }
            return RetryFixture.response(200)
        }
        let middleware = RetryMiddleware(RetryFixture.config { $0.perTryTimeout = .seconds(2) }, random: { 0 })
        let start = clock.now
        let context = RetryFixture.context(clock: clock, deadlineIn: .seconds(30))
        _ = try await middleware.handle(RetryFixture.request(), context: context, next: next.handler)
        #expect(next.deadlines == [start.advanced(by: .seconds(2)), start.advanced(by: .seconds(2))])

        // The overall deadline wins when it is sooner.
        let tight = ScriptedNext { _ in RetryFixture.response(200) }
        _ = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock, deadlineIn: .seconds(1)),
                                        next: tight.handler)
        #expect(tight.deadlines == [start.advanced(by: .seconds(1))])
    }

    @Test("no attempt starts that cannot get its per-try timeout before the deadline")
    func deadlineStopsRetries() async throws {
        let next = ScriptedNext { _ in RetryFixture.response(503) }
        let middleware = RetryMiddleware(RetryFixture.config { $0.perTryTimeout = .seconds(2) }, random: { 0 })
        let context = RetryFixture.context(clock: clock, deadlineIn: .seconds(1))
        let response = try await middleware.handle(RetryFixture.request(), context: context, next: next.handler)
        #expect(response.status.code == 503)
        #expect(next.calls == 1)
        #expect(context.stats.snapshot.extra.contains { $0 == ("retry_stopped", "deadline") })

        // Without a per-try timeout, a backoff that ends past the deadline stops too.
        let slow = ScriptedNext { _ in RetryFixture.response(503) }
        let backoff = RetryMiddleware(RetryFixture.config { $0.backoffBase = .seconds(1); $0.backoffCap = .seconds(1) }, random: { 0.99 })
        _ = try await backoff.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock, deadlineIn: .milliseconds(500)),
                                     next: slow.handler)
        #expect(slow.calls == 1)
    }

    @Test("a spent budget returns the original failure")
    func budgetExhausted() async throws {
        let next = ScriptedNext { _ in RetryFixture.response(503) }
        let middleware = RetryMiddleware(RetryFixture.config { $0.budget = 0; $0.minRetriesPerSecond = 0 }, random: { 0 })
        let context = RetryFixture.context(clock: clock)
        let response = try await middleware.handle(RetryFixture.request(), context: context, next: next.handler)
        #expect(response.status.code == 503)
        #expect(next.calls == 1)
        #expect(context.stats.snapshot.extra.contains { $0 == ("retry_stopped", "budget") })
    }

    @Test("inner middleware runs again for every attempt")
    func innerMiddlewareRerun() async throws {
        let counter = ScriptedNext { _ in RetryFixture.response(200) }
        struct Counting: Middleware {
            let counter: ScriptedNext
            func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
                _ = try await counter.handler(request, context)
                return try await next(request, context)
            }
        }
        struct Flaky: Responder {
            let upstream: ScriptedNext
            func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
                try await upstream.handler(request, context)
            }
        }
        let upstream = ScriptedNext { $0 == 1 ? RetryFixture.response(504) : RetryFixture.response(200) }
        let chain = MiddlewareChain([RetryMiddleware(RetryFixture.config(), random: { 0 }), Counting(counter: counter)],
                                    endpoint: Flaky(upstream: upstream))
        let response = try await chain.respond(to: RetryFixture.request(), context: RetryFixture.context(clock: clock))
        #expect(response.status.code == 200)
        #expect(counter.calls == 2)
    }
}

enum HTTPDateFixture {
    /// IMF-fixdate for `date`, built by hand to test the parser independently.
    static func imf(_ date: Date) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "GMT")!
        let c = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second, .weekday], from: date)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ n: Int?) -> String { String(format: "%02d", n ?? 0) }
        return "\(days[(c.weekday ?? 1) - 1]), \(two(c.day)) \(months[(c.month ?? 1) - 1]) \(c.year ?? 0) \(two(c.hour)):\(two(c.minute)):\(two(c.second)) GMT"
    }
}
