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

/// The shared state of one stream: a `BodyPipeMachine` under one lock. Continuations and
/// wake-ups it hands back are resumed after the lock is released.
final class BodyPipe: Sendable {
    private enum Reader {
        case task(CheckedContinuation<ByteBuffer?, any Error>)
        case wake(@Sendable () -> Void)
    }

    private enum Writer {
        case task(CheckedContinuation<Void, any Error>)
        case wake(@Sendable () -> Void)
    }

    private typealias Machine = BodyPipeMachine<Reader, Writer>

    let highWater: Int
    private let state: Mutex<Machine>

    init(highWater: Int) {
        let machine = Machine(highWater: highWater)
        self.highWater = machine.highWater
        state = Mutex(machine)
    }

    var readerError: GatewayError? { state.withLock { $0.readerGoneReason } }

    // MARK: Writer side

    func write(_ buffer: ByteBuffer) async throws {
        guard buffer.readableBytes > 0 else { return }
        switch state.withLock({ $0.append(buffer) }) {
        case .readerGone(let reason):
            throw reason
        case .queued(let reader, let full):
            if let reader { deliver(to: reader) }
            guard full else { return }
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                // A reader gone comes before cancellation; a cancelled writer never parks.
                let wait = state.withLock { machine -> Machine.WriterWait? in
                    if let reason = machine.readerGoneReason { return .readerGone(reason) }
                    if Task.isCancelled { return nil }
                    return machine.wait(writer: .task(continuation))
                }
                switch wait {
                case .parked?: break
                case .proceed?: continuation.resume()
                case .readerGone(let reason)?: continuation.resume(throwing: reason)
                case nil: continuation.resume(throwing: CancellationError())
                }
            }
        } onCancel: {
            if case .task(let continuation) = state.withLock({ $0.removeWriter() }) {
                continuation.resume(throwing: CancellationError())
            }
        }
    }

    func offer(_ buffer: ByteBuffer, resume: @escaping @Sendable () -> Void) -> BodyOffer {
        let appended = state.withLock { machine -> Machine.Append in
            let appended = machine.append(buffer)
            if case .queued(_, full: true) = appended { machine.pause(writer: .wake(resume)) }
            return appended
        }
        switch appended {
        case .readerGone:
            return .readerGone
        case .queued(let reader, let full):
            if let reader { deliver(to: reader) }
            return full ? .full : .accepted
        }
    }

    func finish() {
        if let reader = state.withLock({ $0.end(failure: nil) }) { deliver(to: reader) }
    }

    func fail(_ error: GatewayError) {
        if let reader = state.withLock({ $0.end(failure: error) }) { deliver(to: reader) }
    }

    func onReaderGone(_ handler: @escaping @Sendable (GatewayError) -> Void) {
        if let gone = state.withLock({ $0.onReaderGone(handler) }) { handler(gone) }
    }

    // MARK: Reader side

    func next() async throws -> ByteBuffer? {
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<ByteBuffer?, any Error>) in
                if Task.isCancelled {
                    continuation.resume(throwing: CancellationError())
                    return
                }
                if let taken = state.withLock({ $0.take(orPark: .task(continuation)) }) {
                    hand(taken, to: continuation)
                }
            }
        } onCancel: {
            readerGone(.clientClosedRequest(), cancelled: true)
        }
    }

    func poll(wake: @escaping @Sendable () -> Void) -> BodyPoll {
        guard let taken = state.withLock({ $0.take(orPark: .wake(wake)) }) else { return .pending }
        if let writer = taken.releasedWriter { Self.resume(writer) }
        switch taken.delivery {
        case .chunk(let buffer): return .chunk(buffer)
        case .end: return .end
        case .failed(let error): return .failed(error)
        }
    }

    /// The reader is gone: drops what is queued, releases a waiting writer with `error`, and
    /// runs the writer's handler. Idempotent; the handler is not run once the body ended
    /// normally and was read, or the writer failed.
    func readerGone(_ error: GatewayError, cancelled: Bool = false) {
        guard let departure = state.withLock({ $0.readerLeaves(error) }) else { return }
        switch departure.reader {
        case .task(let continuation)?:
            continuation.resume(throwing: cancelled ? CancellationError() : error)
        case .wake(let wake)?:
            wake()
        case nil:
            break
        }
        switch departure.writer {
        case .task(let continuation)?: continuation.resume(throwing: error)
        case .wake(let resume)?: resume()
        case nil: break
        }
        departure.handler?(error)
    }

    private func deliver(to reader: Reader) {
        switch reader {
        case .wake(let wake):
            wake()
        case .task(let continuation):
            // A reader waits only on an empty queue and is handed over with what filled it,
            // so there is something to take; if not, it waits again.
            if let taken = state.withLock({ $0.take(orPark: .task(continuation)) }) {
                hand(taken, to: continuation)
            }
        }
    }

    private func hand(_ taken: Machine.Take, to continuation: CheckedContinuation<ByteBuffer?, any Error>) {
        if let writer = taken.releasedWriter { Self.resume(writer) }
        switch taken.delivery {
        case .chunk(let buffer): continuation.resume(returning: buffer)
        case .end: continuation.resume(returning: nil)
        case .failed(let error): continuation.resume(throwing: error)
        }
    }

    private static func resume(_ writer: Writer) {
        switch writer {
        case .task(let continuation): continuation.resume()
        case .wake(let resume): resume()
        }
    }
}
