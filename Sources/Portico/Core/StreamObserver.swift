import NIOCore
import Synchronization

/// A `BodyStage` that only watches a streamed body go by: it counts the bytes, notes when the
/// first one passed, and reports once how the body ended (the access log's line, the request
/// metrics). Appended last, it sees the bytes as they leave (after compression). A body dropped
/// without ever being read still reports, as `client_gone`, when the observer goes.
public final class StreamObserver: BodyStage {
    /// What the observer saw, reported once at the end.
    public struct Observation: Sendable {
        /// Bytes that passed.
        public var bytes: Int
        /// When the first byte passed; `nil` when none did.
        public var firstByte: ContinuousClock.Instant?
        /// When the body ended.
        public var end: ContinuousClock.Instant
        public var ending: StreamEnding
        /// Why it did not end complete.
        public var error: GatewayError?
    }

    private struct State {
        var bytes = 0
        var firstByte: ContinuousClock.Instant?
        var reported = false
    }

    private let state = Mutex(State())
    private let clock: any GatewayClock
    private let onFirstByte: (@Sendable (ContinuousClock.Instant) -> Void)?
    private let onEnd: @Sendable (Observation) -> Void

    /// `onFirstByte` runs when the first byte passes, `onEnd` once when the body ends; both on
    /// the reader's thread (libmicrohttpd's for a response), so neither may block.
    public init(clock: any GatewayClock, onFirstByte: (@Sendable (ContinuousClock.Instant) -> Void)? = nil,
                onEnd: @escaping @Sendable (Observation) -> Void = { _ in }) {
        self.clock = clock
        self.onFirstByte = onFirstByte
        self.onEnd = onEnd
    }

    deinit {
        report(.clientGone, error: .clientClosedRequest())
    }

    /// Bytes that passed so far.
    public var bytes: Int { state.withLock { $0.bytes } }

    public func process(_ chunk: ByteBuffer) throws(GatewayError) -> ByteBuffer {
        let count = chunk.readableBytes
        guard count > 0 else { return chunk }
        let first: ContinuousClock.Instant? = state.withLock { state in
            state.bytes += count
            guard state.firstByte == nil else { return nil }
            let now = clock.now
            state.firstByte = now
            return now
        }
        if let first { onFirstByte?(first) }
        return chunk
    }

    public func finish() throws(GatewayError) -> ByteBuffer? { nil }

    public func ended(_ ending: StreamEnding, error: GatewayError?) {
        report(ending, error: error)
    }

    private func report(_ ending: StreamEnding, error: GatewayError?) {
        let observation: Observation? = state.withLock { state in
            guard !state.reported else { return nil }
            state.reported = true
            return Observation(bytes: state.bytes, firstByte: state.firstByte, end: clock.now, ending: ending,
                               error: ending == .complete ? nil : error)
        }
        if let observation { onEnd(observation) }
    }
}
