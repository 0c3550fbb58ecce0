import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// How an upstream response's body travels, decided from its head: small declared bodies are
/// read whole (buffered, replayable: the fast path), larger or undeclared ones stream.
enum ResponseBodyPlan: Equatable {
    /// Collect it whole (declared length ≤ `Body.bufferedLimit`, or no body at all).
    case buffer
    /// Hand a `Body(stream:)` on at once and relay the bytes as they come.
    case stream(length: Int?)
    /// The declared length alone is over `max_response_bytes`.
    case tooLarge

    init(head: HTTPResponseHead, requestIsHead: Bool, limit: Int) {
        let code = head.status.code
        if !HTTPSyntax.responseHasBody(status: Int(code), toHead: requestIsHead) {
            self = .buffer
            return
        }
        let declared = head.headers.first(name: "content-length").flatMap { Int($0) }
        if let declared, declared > limit {
            self = .tooLarge
        } else if let declared, declared <= Body.bufferedLimit {
            self = .buffer
        } else {
            self = .stream(length: declared)
        }
    }
}

/// Carries one streamed upstream response body from the transport's event loop into a
/// `BodyStream`: counts bytes against `max_response_bytes`, keeps the `StreamWatchdog`
/// (`stream_idle_timeout`, `max_stream_duration`) fed, and cancels the upstream exchange
/// (`cancel`) when the reader goes away, the watchdog expires or the limit is crossed, so a
/// connection is never handed back half-read. `HTTP1ExchangeHandler` uses it: the connection's
/// event loop calls `deliver`, `finish` and `fail`.
final class StreamedResponseRelay: Sendable {
    /// What the transport does with the connection after `deliver`.
    enum Delivery {
        /// Read on.
        case proceed
        /// Stop reading until the `resume` given is called (the reader is a high water behind).
        case pause
        /// The exchange is over (reader gone or limit crossed): cancel it.
        case stop
    }

    /// Whether the writer was finished or failed: nothing may be offered after that, and the
    /// watchdog fails it from its own task, so the check and the offer happen under this lock.
    private final class Ending: Sendable {
        let ended = Mutex(false)

        /// Runs `body` unless the writer has ended; `end` marks it ended first.
        func ifOpen<T>(end: Bool = false, _ body: () -> T) -> T? {
            ended.withLock { ended in
                guard !ended else { return nil }
                if end { ended = true }
                return body()
            }
        }
    }

    let stream: BodyStream
    private let writer: BodyWriter
    private let ending = Ending()
    private let watchdog: StreamWatchdog
    private let limit: Int
    private let upstream: String
    private let logger: Logger
    private let received = Atomic<Int>(0)

    init(length: Int?, limit: Int, upstream: String, context: RequestContext, cancel: @escaping @Sendable () -> Void) {
        let (stream, writer) = BodyStream.makeStream(length: length)
        self.stream = stream
        self.writer = writer
        self.limit = limit
        self.upstream = upstream
        self.logger = context.logger
        let ending = self.ending
        let watchdog = StreamWatchdog(clock: context.clock, idle: context.streamIdleTimeout,
                                      maxDuration: context.maxStreamDuration) { error in
            ending.ifOpen(end: true) { writer.fail(error) }
            cancel()
        }
        self.watchdog = watchdog
        writer.onReaderGone { _ in
            watchdog.stop()
            cancel()
        }
    }

    /// One body part from the upstream. `resume` is called once after a `.pause`.
    func deliver(_ part: ByteBuffer, resume: @escaping @Sendable () -> Void) -> Delivery {
        let total = received.wrappingAdd(part.readableBytes, ordering: .relaxed).newValue
        guard total <= limit else {
            fail(UpstreamError.responseTooLarge(limit: limit))
            return .stop
        }
        let watched: @Sendable () -> Void = { [watchdog] in
            watchdog.resume()
            resume()
        }
        // While the client is behind (the queue full), its pause is not upstream silence:
        // paused first, so a reader catching up at once (`watched`) cannot be overtaken.
        watchdog.pause()
        switch ending.ifOpen({ writer.offer(part, resume: watched) }) {
        case .accepted?:
            watchdog.resume()
            return .proceed
        case .full?:
            return .pause
        case .readerGone?, nil: return .stop
        }
    }

    /// The body arrived whole.
    func finish() {
        watchdog.stop()
        ending.ifOpen(end: true) { writer.finish() }
    }

    /// The exchange failed after the head: the reader gets the mapped error after the bytes
    /// before it (a reset or short body is `upstream_connection_closed`). A failure that
    /// follows the watchdog's or the reader's own ending changes nothing.
    func fail(_ error: any Error) {
        watchdog.stop()
        let mapped = NIOUpstream.classify(error, afterHead: true, limit: limit)
            ?? .connectionClosed("the exchange was cancelled")
        ending.ifOpen(end: true) {
            if writer.readerGone == nil { mapped.log(upstream: upstream, to: logger) }
            writer.fail(mapped.gatewayError(upstream: upstream))
        }
    }
}

/// Sends a streamed request body upstream: reads it chunk by chunk and awaits each `write`
/// (so a slow upstream slows the client's upload), while a `StreamWatchdog` bounds the silence
/// between chunks (`stream_idle_timeout`) and the upload's length (`max_stream_duration`).
///
/// The route's `timeout` does not run while the body flows: an upload may take as long as its
/// bytes keep coming. The wait for the response head is bounded by the same budget counted
/// from `ended()`, the moment the upload is over.
final class UpstreamUpload: Sendable {
    private static let exchangeEnded = GatewayError(.clientClosedRequest,
                                                    message: "the upstream exchange ended before the request body was sent")

    private struct State {
        var ended = false
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter = 0
        var failure: GatewayError?
        var reader: BodyReader?
        var cancelled = false
    }

    private let body: Body
    private let context: RequestContext
    private let state = Mutex(State())

    init(_ body: Body, context: RequestContext) {
        self.body = body
        self.context = context
    }

    /// The body's declared length (`nil`: chunked).
    var length: Int? { body.count }

    /// The upload's own failure (the client went away, or its body stalled), which explains
    /// the exchange's failure better than the transport's error does.
    var failure: GatewayError? { state.withLock { $0.failure } }

    /// Pumps the body into `write` to its end. Throws the body's failure or `write`'s.
    func run(write: (ByteBuffer) async throws -> Void) async throws {
        let reader = body.reader()
        state.withLock { $0.reader = reader }
        let watchdog = StreamWatchdog(clock: context.clock, idle: context.streamIdleTimeout,
                                      maxDuration: context.maxStreamDuration) { error in
            reader.close(GatewayError(.requestTimeout, message: "request body: \(error.message)"))
        }
        defer {
            watchdog.stop()
            end()
        }
        do {
            while let chunk = try await reader.next() {
                watchdog.touch()
                try await write(chunk)
            }
        } catch let error as GatewayError {
            state.withLock { state in
                if !state.cancelled, state.failure == nil { state.failure = error }
            }
            throw error
        } catch {
            reader.close(Self.exchangeEnded)
            throw error
        }
    }

    /// Stops an upload that is still running (the exchange failed or was cancelled).
    func cancel() {
        let reader = state.withLock { state in
            state.cancelled = true
            return state.reader
        }
        reader?.close(Self.exchangeEnded)
    }

    /// Returns once the upload is over, whichever way it ended, or the task is cancelled.
    func ended() async {
        let id = state.withLock { state in
            defer { state.nextWaiter += 1 }
            return state.nextWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let now = state.withLock { state -> Bool in
                    if state.ended || Task.isCancelled { return true }
                    state.waiters[id] = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }

    private func end() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.ended = true
            state.reader = nil
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        waiters.forEach { $0.resume() }
    }
}

/// Like `withUpstreamDeadline`, for an exchange whose request body streams: `budget` counts
/// from the end of `upload` (the response head cannot be expected before the body is sent).
func withUpstreamDeadline<T: Sendable>(
    _ budget: Duration, after upload: UpstreamUpload, clock: any GatewayClock,
    _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    try await race(operation, against: {
        await upload.ended()
        try Task.checkCancellation()
        try await clock.sleep(for: budget)
    })
}
