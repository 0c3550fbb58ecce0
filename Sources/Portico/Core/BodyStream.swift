import NIOCore
import Synchronization

/// How a streamed body ended: the access log's `ended` field. A closed set.
public enum StreamEnding: String, Sendable, CaseIterable {
    /// Every byte was delivered (and framed as complete).
    case complete
    /// The reader went away first: the client hung up, or the consumer dropped the body.
    case clientGone = "client_gone"
    /// The writer failed mid-body: the upstream reset or closed its connection short.
    case upstreamReset = "upstream_reset"
    /// No chunk within `stream_idle_timeout`, or the stream outlived `max_stream_duration`
    /// (or the request its deadline).
    case timeout
    /// The body crossed `max_body_bytes` / `max_response_bytes` as it flowed.
    case tooLarge = "too_large"

    /// The ending a failure means.
    public init(_ error: GatewayError) {
        switch error.kind {
        case .clientClosedRequest: self = .clientGone
        case .upstreamTimeout, .requestTimeout, .upstreamConnectTimeout: self = .timeout
        case .upstreamResponseTooLarge, .payloadTooLarge: self = .tooLarge
        default: self = .upstreamReset
        }
    }
}

/// A body that flows while it is sent: a bounded pipe of buffers between one writer (an
/// upstream's response, a client's upload) and one reader (libmicrohttpd's content reader, an
/// upstream request). The writer waits — or, writing from a callback, is told to pause — once
/// `highWater` bytes are queued, and goes on when the reader has taken them down to half of
/// it, so a fast side never makes the gateway hold more than about `highWater` per stream.
///
/// This object is the reader's end. When the last reference to it goes (every `Body` copy
/// dropped without reading to the end), the writer learns the reader is gone: its next write
/// throws `client_closed_request` and its `onReaderGone` handler runs (cancelling an upstream
/// request that is waiting for data). Exactly one reader: a second one gets an error.
public final class BodyStream: Sendable {
    let pipe: BodyPipe
    /// The length the body declared (`Content-Length`), if any.
    public let length: Int?
    /// Per-stream bound on queued bytes: 256 KiB, a few of libmicrohttpd's or NIO's reads.
    public static let defaultHighWater = 256 * 1024

    /// A stream and the writer that feeds it.
    public static func makeStream(length: Int? = nil, highWater: Int = BodyStream.defaultHighWater)
        -> (stream: BodyStream, writer: BodyWriter) {
        let pipe = BodyPipe(highWater: highWater)
        return (BodyStream(pipe: pipe, length: length), BodyWriter(pipe: pipe))
    }

    init(pipe: BodyPipe, length: Int?) {
        self.pipe = pipe
        self.length = length
    }

    deinit {
        pipe.readerGone(.clientClosedRequest())
    }

    /// The next buffer, or `nil` at the end. Throws the writer's failure (a `GatewayError`),
    /// or `CancellationError` when the reading task is cancelled (the stream is then failed
    /// for the writer too).
    public func next() async throws -> ByteBuffer? {
        try await pipe.next()
    }

    /// Reads without waiting, for a reader on a thread that must not block (libmicrohttpd's).
    /// With nothing queued, `wake` is kept and called once when there is.
    public func poll(wake: @escaping @Sendable () -> Void) -> BodyPoll {
        pipe.poll(wake: wake)
    }

    /// The reader gives up: the writer is told (`error`'s kind decides how the log names it).
    public func cancel(_ error: GatewayError = .clientClosedRequest()) {
        pipe.readerGone(error)
    }
}

/// What a non-waiting read found.
public enum BodyPoll: Sendable {
    case chunk(ByteBuffer)
    /// Nothing yet; the `wake` given will be called.
    case pending
    case end
    case failed(GatewayError)
}

/// The writing end of a `BodyStream`. Finish or fail it exactly once; a writer dropped without
/// either fails the stream as an upstream reset, so a reader never waits forever.
public final class BodyWriter: Sendable {
    let pipe: BodyPipe

    init(pipe: BodyPipe) {
        self.pipe = pipe
    }

    deinit {
        pipe.fail(GatewayError(.upstreamConnectionClosed, message: "the body's writer stopped before its end"))
    }

    /// Queues `buffer`, waiting while the reader is `highWater` behind. Throws the reader's
    /// reason when it is gone (stop writing then), or `CancellationError`.
    public func write(_ buffer: ByteBuffer) async throws {
        try await pipe.write(buffer)
    }

    /// Queues `buffer` without waiting, for writers on a callback (URLSession's delegate,
    /// libmicrohttpd's upload). Returns `.accepted`, `.full` (queued, but pause until `resume`
    /// is called), or `.readerGone` (dropped: stop, the exchange is over).
    public func offer(_ buffer: ByteBuffer, resume: @escaping @Sendable () -> Void) -> BodyOffer {
        pipe.offer(buffer, resume: resume)
    }

    /// The body is complete.
    public func finish() {
        pipe.finish()
    }

    /// The body cannot be completed: the reader fails with `error` once it has read what came before.
    public func fail(_ error: GatewayError) {
        pipe.fail(error)
    }

    /// Runs `handler` once if the reader goes away before the end (or at once if it has):
    /// cancel the work that feeds this writer.
    public func onReaderGone(_ handler: @escaping @Sendable (GatewayError) -> Void) {
        pipe.onReaderGone(handler)
    }

    /// Whether the reader has gone away (its reason), without writing.
    public var readerGone: GatewayError? { pipe.readerError }
}

public enum BodyOffer: Sendable, Equatable {
    case accepted
    /// Queued; the writer must pause until its `resume` is called.
    case full
    /// Not queued: the reader is gone.
    case readerGone
}

/// The shared state of one stream. All transitions happen under one lock; continuations and
/// wake-ups are resumed after it is released.
final class BodyPipe: Sendable {
    private enum Reader {
        case task(CheckedContinuation<ByteBuffer?, any Error>)
        case wake(@Sendable () -> Void)
    }

    private enum Writer {
        case task(CheckedContinuation<Void, any Error>)
        case wake(@Sendable () -> Void)
    }

    private struct State {
        var chunks = CircularBuffer<ByteBuffer>(initialCapacity: 4)
        var queued = 0
        var finished = false
        /// The writer's failure, delivered after what was queued before it.
        var writerError: GatewayError?
        /// Set when the reader went away: nothing more is queued or delivered.
        var readerError: GatewayError?
        var reader: Reader?
        var writer: Writer?
        var readerGoneHandler: (@Sendable (GatewayError) -> Void)?
    }

    let highWater: Int
    private let state = Mutex(State())

    init(highWater: Int) {
        self.highWater = max(1, highWater)
    }

    var readerError: GatewayError? { state.withLock { $0.readerError } }

    // MARK: Writer side

    func write(_ buffer: ByteBuffer) async throws {
        guard buffer.readableBytes > 0 else { return }
        let outcome: (wake: Reader?, mustWait: Bool, gone: GatewayError?) = state.withLock { state in
            if let gone = state.readerError { return (nil, false, gone) }
            precondition(!state.finished && state.writerError == nil, "write after the body ended")
            state.chunks.append(buffer)
            state.queued += buffer.readableBytes
            let reader = state.reader
            state.reader = nil
            return (reader, state.queued >= highWater, nil)
        }
        if let gone = outcome.gone { throw gone }
        if let reader = outcome.wake { deliver(to: reader) }
        guard outcome.mustWait else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow: Result<Void, any Error>? = state.withLock { state in
                    if let gone = state.readerError { return .failure(gone) }
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if state.queued < highWater / 2 + 1 { return .success(()) }
                    state.writer = .task(continuation)
                    return nil
                }
                if let resumeNow { continuation.resume(with: resumeNow) }
            }
        } onCancel: {
            let waiting = state.withLock { state -> Writer? in
                defer { state.writer = nil }
                return state.writer
            }
            if case .task(let continuation) = waiting { continuation.resume(throwing: CancellationError()) }
        }
    }

    func offer(_ buffer: ByteBuffer, resume: @escaping @Sendable () -> Void) -> BodyOffer {
        let outcome: (wake: Reader?, offer: BodyOffer) = state.withLock { state in
            if state.readerError != nil { return (nil, .readerGone) }
            precondition(!state.finished && state.writerError == nil, "write after the body ended")
            if buffer.readableBytes > 0 {
                state.chunks.append(buffer)
                state.queued += buffer.readableBytes
            }
            let reader = state.reader
            state.reader = nil
            guard state.queued >= highWater else { return (reader, .accepted) }
            state.writer = .wake(resume)
            return (reader, .full)
        }
        if let reader = outcome.wake { deliver(to: reader) }
        return outcome.offer
    }

    func finish() {
        end(failure: nil)
    }

    func fail(_ error: GatewayError) {
        end(failure: error)
    }

    /// The writer's end, whole (`nil`) or failed; the first one counts.
    private func end(failure: GatewayError?) {
        let reader = state.withLock { state -> Reader? in
            guard !state.finished, state.writerError == nil else { return nil }
            if let failure { state.writerError = failure } else { state.finished = true }
            defer { state.reader = nil }
            return state.reader
        }
        if let reader { deliver(to: reader) }
    }

    func onReaderGone(_ handler: @escaping @Sendable (GatewayError) -> Void) {
        let gone = state.withLock { state -> GatewayError? in
            if let error = state.readerError { return error }
            state.readerGoneHandler = handler
            return nil
        }
        if let gone { handler(gone) }
    }

    // MARK: Reader side

    func next() async throws -> ByteBuffer? {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<ByteBuffer?, any Error>) in
                if Task.isCancelled {
                    continuation.resume(throwing: CancellationError())
                    return
                }
                let ready: (Result<ByteBuffer?, any Error>, Writer?)? = state.withLock { state in
                    if let result = Self.take(&state, highWater: highWater) { return (result.0, result.1) }
                    state.reader = .task(continuation)
                    return nil
                }
                if let (result, writer) = ready {
                    if let writer { Self.resume(writer) }
                    continuation.resume(with: result)
                }
            }
        } onCancel: {
            readerGone(.clientClosedRequest(), cancelled: true)
        }
    }

    func poll(wake: @escaping @Sendable () -> Void) -> BodyPoll {
        let taken: (Result<ByteBuffer?, any Error>, Writer?)? = state.withLock { state in
            if let result = Self.take(&state, highWater: highWater) { return (result.0, result.1) }
            state.reader = .wake(wake)
            return nil
        }
        guard let (result, writer) = taken else { return .pending }
        if let writer { Self.resume(writer) }
        switch result {
        case .success(let buffer?): return .chunk(buffer)
        case .success(nil): return .end
        case .failure(let error): return .failed(error as? GatewayError ?? .clientClosedRequest())
        }
    }

    /// What the reader gets now, if anything, and the writer to release when the queue fell
    /// below half of `highWater`.
    private static func take(_ state: inout State, highWater: Int) -> (Result<ByteBuffer?, any Error>, Writer?)? {
        if let gone = state.readerError { return (.failure(gone), nil) }
        if let buffer = state.chunks.popFirst() {
            state.queued -= buffer.readableBytes
            var writer: Writer?
            if state.queued <= highWater / 2, let waiting = state.writer {
                writer = waiting
                state.writer = nil
            }
            return (.success(buffer), writer)
        }
        if let error = state.writerError { return (.failure(error), nil) }
        if state.finished { return (.success(nil), nil) }
        return nil
    }

    /// The reader is gone: drops what is queued, releases a waiting writer with `error`, and
    /// runs the writer's handler. Idempotent; ignored once the body ended normally and was read.
    func readerGone(_ error: GatewayError, cancelled: Bool = false) {
        let (reader, writer, handler) = state.withLock { state -> (Reader?, Writer?, (@Sendable (GatewayError) -> Void)?) in
            guard state.readerError == nil else { return (nil, nil, nil) }
            let complete = state.finished && state.chunks.isEmpty
            state.readerError = error
            state.chunks.removeAll()
            state.queued = 0
            defer { (state.reader, state.writer, state.readerGoneHandler) = (nil, nil, nil) }
            // A body read to its end needs no one told; a writer that failed knows already.
            let tell = complete || state.writerError != nil ? nil : state.readerGoneHandler
            return (state.reader, state.writer, tell)
        }
        if let reader {
            switch reader {
            case .task(let continuation):
                continuation.resume(throwing: cancelled ? CancellationError() : error)
            case .wake(let wake):
                wake()
            }
        }
        if let writer {
            switch writer {
            case .task(let continuation): continuation.resume(throwing: error)
            case .wake(let resume): resume()
            }
        }
        handler?(error)
    }

    private func deliver(to reader: Reader) {
        switch reader {
        case .wake(let wake):
            wake()
        case .task(let continuation):
            let taken = state.withLock { state in Self.take(&state, highWater: highWater) }
            guard let (result, writer) = taken else {
                // Nothing to give after all (cannot happen: a reader waits only on an empty
                // queue, and is handed over together with what filled it): wait again.
                state.withLock { $0.reader = .task(continuation) }
                return
            }
            if let writer { Self.resume(writer) }
            continuation.resume(with: result)
        }
    }

    private static func resume(_ writer: Writer) {
        switch writer {
        case .task(let continuation): continuation.resume()
        case .wake(let resume): resume()
        }
    }
}
