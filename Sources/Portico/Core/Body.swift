import NIOCore
import Synchronization

/// A message body: buffered (a `ByteBuffer`, small and whole: replayable for retries and 401
/// replays) or streamed (a `BodyStream` that flows with backpressure: large transfers, SSE,
/// uploads). Middleware that never reads bodies works with both; middleware that does either
/// handles a stream chunk by chunk through a `BodyStage`, or reads it whole with `collect`.
public struct Body: Sendable {
    enum Storage: Sendable {
        case buffer(ByteBuffer)
        case stream(BodyStream)
    }

    var storage: Storage
    /// What a streamed body passes through on its way out, innermost (closest to the
    /// upstream) first. Empty for a buffered body: its middleware changes the buffer itself.
    public private(set) var stages: [any BodyStage] = []
    /// Whether a stage changed the length, so `count` is no longer the stream's declared one.
    private var lengthChanged = false

    public static let empty = Body(ByteBuffer())

    /// A body that declares a length up to this is read whole before it is passed on (one
    /// write, replayable); larger or undeclared ones stream. The default of
    /// `listen.buffer_request_body`, and the transports' limit for responses.
    public static let bufferedLimit = 64 * 1024

    public init(_ buffer: ByteBuffer) {
        storage = .buffer(buffer)
    }

    public init(bytes: some Sequence<UInt8>) {
        self.init(ByteBuffer(bytes: bytes))
    }

    public init(string: String) {
        self.init(ByteBuffer(string: string))
    }

    /// A streamed body.
    public init(stream: BodyStream) {
        storage = .stream(stream)
    }

    /// The length when it is known up front: a buffer's size, a stream's declared length
    /// (unless a stage changes it).
    public var count: Int? {
        switch storage {
        case .buffer(let buffer): buffer.readableBytes
        case .stream(let stream): lengthChanged ? nil : stream.length
        }
    }

    /// The whole body as one buffer; `nil` for a streamed body.
    public var buffer: ByteBuffer? {
        switch storage {
        case .buffer(let buffer): buffer
        case .stream: nil
        }
    }

    /// The stream, for a streamed body.
    public var stream: BodyStream? {
        switch storage {
        case .buffer: nil
        case .stream(let stream): stream
        }
    }

    public var isStreamed: Bool { stream != nil }

    /// The body's bytes as an array (tests, small bodies); empty for a streamed body.
    public var bytes: [UInt8] {
        switch storage {
        case .buffer(let buffer): Array(buffer.readableBytesView)
        case .stream: []
        }
    }

    /// Whether the body can be sent again (retries, 401 replays): only a buffered one.
    public var isReplayable: Bool {
        switch storage {
        case .buffer: true
        case .stream: false
        }
    }

    /// Adds `stage` to a streamed body's way out (after the stages already there). A stage
    /// that changes the bytes' count (a compressor) passes `keepsLength: false`.
    public mutating func append(_ stage: any BodyStage, keepsLength: Bool) {
        precondition(isStreamed, "stages apply to streamed bodies; change a buffered body directly")
        stages.append(stage)
        if !keepsLength { lengthChanged = true }
    }

    /// A reader for the body's bytes after its stages. A buffered body reads as one chunk.
    public func reader() -> BodyReader {
        switch storage {
        case .buffer(let buffer): BodyReader(buffer: buffer)
        case .stream(let stream): BodyReader(stream: stream, stages: stages)
        }
    }

    /// The whole body, read to its end through its stages; throws `tooLarge` as soon as it
    /// passes `limit` bytes (the stream is cancelled then), or the stream's failure.
    public func collect(upTo limit: Int, tooLarge: @autoclosure () -> GatewayError) async throws -> ByteBuffer {
        if case .buffer(let buffer) = storage {
            guard buffer.readableBytes <= limit else { throw tooLarge() }
            return buffer
        }
        let reader = reader()
        var whole = ByteBuffer()
        while let chunk = try await reader.next() {
            guard whole.readableBytes + chunk.readableBytes <= limit else {
                let error = tooLarge()
                reader.close(error)
                throw error
            }
            whole.writeImmutableBuffer(chunk)
        }
        return whole
    }
}

extension Body: ExpressibleByStringLiteral {
    public init(stringLiteral value: String) {
        self.init(string: value)
    }
}

/// A step a streamed body passes through on its way to the client: a transformation
/// (compression) or an observer (a cache tee, the access log). Called on the reader's thread,
/// one chunk at a time and never concurrently; it must not block (libmicrohttpd's thread may
/// be the reader).
public protocol BodyStage: AnyObject, Sendable {
    /// The bytes to pass on for `chunk` (`chunk` itself to observe only; may be empty). A
    /// thrown `GatewayError` fails the stream.
    func process(_ chunk: ByteBuffer) throws(GatewayError) -> ByteBuffer
    /// The body ended whole: bytes to add at its end (a compressor's trailer), if any.
    func finish() throws(GatewayError) -> ByteBuffer?
    /// How the body ended; called exactly once, last.
    func ended(_ ending: StreamEnding, error: GatewayError?)
}

/// Reads a body through its stages, by waiting (`next`) or by polling (`poll`, for
/// libmicrohttpd's thread). One reader per body. Every stage hears how the body ended exactly
/// once: at the end or failure `next` reports it, `close` names it, or when the reader is
/// dropped unfinished (`client_gone`).
public final class BodyReader: Sendable {
    private enum Source {
        case buffer(ByteBuffer)
        case stream(BodyStream)
    }

    /// Where reading stands; each case carries what it needs.
    private enum Phase {
        /// Reading the source.
        case reading(Source)
        /// The source ended whole; the stages' trailer is still to be delivered.
        case trailing(ByteBuffer)
        /// Every byte was delivered.
        case ended
        /// Reading failed (the stream, if any, is cancelled with the failure when closed).
        case failed(GatewayError, BodyStream?)
        /// Closed: the stages have heard how it ended.
        case closed(complete: Bool, error: GatewayError?)
    }

    private let stages: [any BodyStage]
    private let state: Mutex<Phase>

    init(buffer: ByteBuffer) {
        stages = []
        state = Mutex(.reading(.buffer(buffer)))
    }

    init(stream: BodyStream, stages: [any BodyStage]) {
        self.stages = stages
        state = Mutex(.reading(.stream(stream)))
    }

    deinit {
        close(.clientClosedRequest())
    }

    /// Whether every byte was read.
    public var isComplete: Bool {
        state.withLock { phase in
            switch phase {
            case .ended, .closed(complete: true, _): true
            default: false
            }
        }
    }

    /// The next chunk after the stages, `nil` at the end. At the end or a failure the stages
    /// hear how it ended.
    public func next() async throws -> ByteBuffer? {
        while true {
            switch advance(pull: nil) {
            case .chunk(let chunk): return chunk
            case .end:
                close(nil)
                return nil
            case .failed(let error): throw error
            case .pending(let stream):
                // The one thing `poll` cannot do: wait for the stream.
                let raw: ByteBuffer?
                do {
                    raw = try await stream.next()
                } catch let error as GatewayError {
                    fail(error)
                    close(nil)
                    throw error
                } catch {
                    fail(.clientClosedRequest())
                    close(nil)
                    throw error
                }
                do {
                    if let chunk = try staged(raw) { return chunk }
                } catch {
                    close(nil)
                    throw error
                }
            }
        }
    }

    /// The next chunk without waiting: `.pending` keeps `wake` for when there is one. The
    /// owner calls `close` when the exchange is over.
    public func poll(wake: @escaping @Sendable () -> Void) -> BodyPoll {
        switch advance(pull: { $0.poll(wake: wake) }) {
        case .chunk(let chunk): .chunk(chunk)
        case .end: .end
        case .failed(let error): .failed(error)
        case .pending: .pending
        }
    }

    /// Ends reading: `nil` when the body was delivered whole (the stages hear `complete` if
    /// it was read to its end), or the reason it was not. The stream's writer is told when
    /// the body was not read to its end. Idempotent.
    public func close(_ error: GatewayError?) {
        let outcome = state.withLock { phase -> (StreamEnding, GatewayError?, BodyStream?)? in
            let result: (StreamEnding, GatewayError?, BodyStream?)
            switch phase {
            case .closed:
                return nil
            case .failed(let failure, let stream):
                result = (StreamEnding(failure), failure, stream)
            case .ended where error == nil:
                result = (.complete, nil, nil)
            case .ended, .trailing, .reading(.buffer):
                let reason = error ?? .clientClosedRequest()
                result = (StreamEnding(reason), reason, nil)
            case .reading(.stream(let stream)):
                let reason = error ?? .clientClosedRequest()
                result = (StreamEnding(reason), reason, stream)
            }
            phase = .closed(complete: result.0 == .complete, error: result.1)
            return result
        }
        guard let (ending, error, unfinished) = outcome else { return }
        if let unfinished, let error { unfinished.cancel(error) }
        for stage in stages { stage.ended(ending, error: error) }
    }

    private enum Outcome {
        case chunk(ByteBuffer)
        case end
        case failed(GatewayError)
        /// The stream has nothing now (`poll` left its wake with it), or the caller waits for it.
        case pending(BodyStream)
    }

    /// The one loop both readers run: takes the next step of the phase, reads the stream with
    /// `pull` when it must (`nil`: the caller reads it itself, waiting), and passes what came
    /// through the stages, until there is a chunk, the end, a failure, or nothing yet.
    private func advance(pull: ((BodyStream) -> BodyPoll)?) -> Outcome {
        while true {
            let stream: BodyStream
            switch state.withLock({ Self.step(&$0) }) {
            case .deliver(let chunk): return .chunk(chunk)
            case .end: return .end
            case .failed(let error): return .failed(error)
            case .read(let source): stream = source
            }
            guard let pull else { return .pending(stream) }
            let raw: ByteBuffer?
            switch pull(stream) {
            case .pending: return .pending(stream)
            case .chunk(let chunk): raw = chunk
            case .end: raw = nil
            case .failed(let error):
                fail(error)
                return .failed(error)
            }
            do {
                if let chunk = try staged(raw) { return .chunk(chunk) }
            } catch {
                return .failed(error)
            }
        }
    }

    private enum Step {
        case deliver(ByteBuffer)
        case end
        case failed(GatewayError)
        case read(BodyStream)
    }

    private static func step(_ phase: inout Phase) -> Step {
        switch phase {
        case .failed(let error, _):
            return .failed(error)
        case .closed(let complete, let error):
            return complete ? .end : .failed(error ?? .clientClosedRequest())
        case .trailing(let trailer):
            phase = .ended
            return .deliver(trailer)
        case .ended:
            return .end
        case .reading(.buffer(let buffer)):
            phase = .ended
            return buffer.readableBytes > 0 ? .deliver(buffer) : .end
        case .reading(.stream(let stream)):
            return .read(stream)
        }
    }

    /// `raw` through the stages: a chunk to deliver, or `nil` when the stages swallowed it
    /// (read on). At the source's end the stages' trailer is queued.
    private func staged(_ raw: ByteBuffer?) throws(GatewayError) -> ByteBuffer? {
        do {
            guard var chunk = raw else {
                var tail = ByteBuffer()
                for stage in stages {
                    if tail.readableBytes > 0 { tail = try stage.process(tail) }
                    if let trailer = try stage.finish() { tail.writeImmutableBuffer(trailer) }
                }
                state.withLock { phase in
                    guard case .reading = phase else { return }
                    phase = tail.readableBytes > 0 ? .trailing(tail) : .ended
                }
                return nil
            }
            for stage in stages {
                chunk = try stage.process(chunk)
                if chunk.readableBytes == 0 { return nil }
            }
            return chunk
        } catch {
            fail(error)
            throw error
        }
    }

    private func fail(_ error: GatewayError) {
        state.withLock { phase in
            switch phase {
            case .reading(.stream(let stream)): phase = .failed(error, stream)
            case .reading(.buffer), .trailing, .ended: phase = .failed(error, nil)
            case .failed, .closed: break
            }
        }
    }
}
