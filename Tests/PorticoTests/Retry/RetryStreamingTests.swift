import HTTPTypes
import Logging
import NIOCore
import Portico
import PorticoTesting
import Synchronization
import Testing

/// Only a replayable (buffered) request is retried; a discarded streamed response is cancelled.
@Suite("Retry: streamed bodies", .timeLimit(.minutes(1)))
struct RetryStreamingTests {
    typealias S = MiddlewareStreamFixture

    @Test("a streamed request body is sent once, and that is logged once with the request id")
    func streamedRequestSentOnce() async throws {
        let capture = LogCapture(message: "request body is streamed: not retried")
        let clock = ManualClock()
        var context = RetryFixture.context(clock: clock)
        context.logger = capture.logger
        let (body, _) = S.body()
        var request = RetryFixture.request(.put)
        request.body = body
        let next = ScriptedNext { _ in RetryFixture.response(503) }
        let response = try await RetryMiddleware(RetryFixture.config(), random: { 0 })
            .handle(request, context: context, next: next.handler)
        #expect(response.status.code == 503)
        #expect(next.calls == 1)
        #expect(capture.records.count == 1)
        #expect(capture.records.first?["request_id"]?.description == "r1")
    }

    @Test("a discarded response's streamed body is cancelled before the next attempt, releasing its connection")
    func discardedStreamCancelled() async throws {
        let (failed, writer) = S.response(503)
        let released = Mutex<GatewayError?>(nil)
        writer.onReaderGone { error in released.withLock { $0 = error } }
        let seenBySecondAttempt = Mutex<Bool?>(nil)
        let next = ScriptedNext { attempt in
            if attempt == 1 { return failed }
            seenBySecondAttempt.withLock { $0 = released.withLock { $0 } != nil }
            return RetryFixture.response(200)
        }
        let response = try await RetryMiddleware(RetryFixture.config(), random: { 0 })
            .handle(RetryFixture.request(), context: RetryFixture.context(clock: ManualClock()), next: next.handler)
        #expect(response.status == .ok)
        #expect(next.calls == 2)
        #expect(seenBySecondAttempt.withLock { $0 } == true)
        #expect(writer.readerGone != nil)
    }

    @Test("a streamed response that is returned is left alone")
    func returnedStreamUntouched() async throws {
        let (ok, writer) = S.response(200)
        let next = ScriptedNext { _ in ok }
        let response = try await RetryMiddleware(RetryFixture.config(), random: { 0 })
            .handle(RetryFixture.request(), context: RetryFixture.context(clock: ManualClock()), next: next.handler)
        #expect(writer.readerGone == nil)
        let reader = response.body.reader()
        try await writer.write(S.buffer("x"))
        writer.finish()
        #expect(try await S.rest(of: reader) == Array("x".utf8))
    }
}
