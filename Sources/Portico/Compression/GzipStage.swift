import NIOCore
import Synchronization

/// gzip for a streamed response, chunk by chunk: one deflate stream per response, each chunk
/// flushed (`Z_SYNC_FLUSH`) so what the upstream sent reaches the client without waiting for
/// more, the gzip trailer added when the body ends whole. Memory stays at zlib's state plus one
/// chunk's output, whatever the body's size. zlib's state is freed when the body ends, however
/// it ends.
final class GzipStage: BodyStage {
    private struct State {
        var deflater: Deflater?
        var bytesIn = 0
        var bytesOut = 0
    }

    private let state: Mutex<State>
    /// Told once, when the body ends: bytes taken in, bytes given out, and how it ended.
    private let onEnd: @Sendable (_ bytesIn: Int, _ bytesOut: Int, StreamEnding) -> Void

    init(settings: Zlib.Settings,
         onEnd: @escaping @Sendable (_ bytesIn: Int, _ bytesOut: Int, StreamEnding) -> Void = { _, _, _ in }) throws(Zlib.Failure) {
        let deflater = try Deflater(format: .gzip, settings: settings)
        state = Mutex(State(deflater: deflater))
        self.onEnd = onEnd
    }

    /// Whether zlib's state is still held (tests: it must be freed on every ending).
    var holdsZlibState: Bool { state.withLock { $0.deflater != nil } }

    func process(_ chunk: ByteBuffer) throws(GatewayError) -> ByteBuffer {
        try state.withLock { state throws(GatewayError) -> ByteBuffer in
            guard let deflater = state.deflater else { throw Self.ended() }
            let output = try Self.deflate(chunk, with: deflater, finish: false)
            state.bytesIn += chunk.readableBytes
            state.bytesOut += output.readableBytes
            return output
        }
    }

    func finish() throws(GatewayError) -> ByteBuffer? {
        try state.withLock { state throws(GatewayError) -> ByteBuffer? in
            guard let deflater = state.deflater else { throw Self.ended() }
            let trailer = try Self.deflate(ByteBuffer(), with: deflater, finish: true)
            state.bytesOut += trailer.readableBytes
            return trailer
        }
    }

    func ended(_ ending: StreamEnding, error: GatewayError?) {
        let counts = state.withLock { state -> (Int, Int)? in
            guard state.deflater != nil else { return nil }
            state.deflater = nil  // deflateEnd
            return (state.bytesIn, state.bytesOut)
        }
        if let (bytesIn, bytesOut) = counts { onEnd(bytesIn, bytesOut, ending) }
    }

    /// `input` compressed and flushed (or finished), in slices zlib accepts.
    private static func deflate(_ input: ByteBuffer, with deflater: Deflater, finish: Bool) throws(GatewayError) -> ByteBuffer {
        var output = ByteBuffer()
        output.reserveCapacity(min(deflater.bound(input.readableBytes), 64 * 1024))
        var offset = 0
        do throws(Zlib.Failure) {
            repeat {
                let end = min(offset + Zlib.sliceBytes, input.readableBytes)
                let last = end == input.readableBytes
                _ = try deflater.deflate(input, range: offset..<end, finish: finish && last, syncFlush: last,
                                         into: &output, limit: .max)
                offset = end
            } while offset < input.readableBytes
        } catch {
            throw GatewayError(.internalError, message: "compressing the streamed response failed: \(error)")
        }
        return output
    }

    private static func ended() -> GatewayError {
        GatewayError(.internalError, message: "the compressed stream was used after it ended")
    }
}
