import MicroHTTPD
import NIOCore
import Synchronization

// The two ends where the server's streamed bodies meet the gateway's `BodyStream`s.

/// A streamed response body as libmicrohttpd pulls it: chunks from the body's reader (after
/// its stages), copied into libmicrohttpd's buffer; a chunk larger than the buffer is handed
/// over in pieces.
final class StreamedResponseSource: ResponseBodySource {
    private let reader: BodyReader
    /// The rest of a chunk the last buffer could not take.
    private let leftover = Mutex<ByteBuffer?>(nil)

    init(_ body: Body) {
        reader = body.reader()
    }

    func read(into buffer: UnsafeMutableRawBufferPointer, wake: @escaping @Sendable () -> Void) -> ResponseBodyRead {
        var chunk: ByteBuffer
        if let left = leftover.withLock({ left -> ByteBuffer? in defer { left = nil }; return left }) {
            chunk = left
        } else {
            switch reader.poll(wake: wake) {
            case .chunk(let next): chunk = next
            case .pending: return .pending
            case .end: return .end
            case .failed: return .failed
            }
        }
        let count = min(chunk.readableBytes, buffer.count)
        chunk.withUnsafeReadableBytes { bytes in
            buffer.baseAddress!.copyMemory(from: bytes.baseAddress!, byteCount: count)
        }
        chunk.moveReaderIndex(forwardBy: count)
        if chunk.readableBytes > 0 {
            leftover.withLock { $0 = chunk }
        }
        return .bytes(count)
    }

    func close(delivered: Bool) {
        reader.close(delivered ? nil : .clientClosedRequest())
    }
}

/// A streamed request body as libmicrohttpd reads it, into the `BodyStream` the chain's
/// request carries.
final class StreamedUploadSink: RequestBodySink {
    private let writer: BodyWriter

    init(_ writer: BodyWriter) {
        self.writer = writer
    }

    func write(_ bytes: UnsafeRawBufferPointer, resume: @escaping @Sendable () -> Void) -> RequestBodyWrite {
        let buffer = ByteBuffer(bytes: bytes)
        switch writer.offer(buffer, resume: resume) {
        case .accepted: return .accepted
        case .full: return .full
        case .readerGone: return .closed
        }
    }

    func finish() {
        writer.finish()
    }

    func fail(_ reason: UploadFailure) {
        switch reason {
        case .clientGone:
            writer.fail(.clientClosedRequest())
        case .tooLarge(let limit):
            writer.fail(GatewayError(.payloadTooLarge, message: "the request body is larger than \(limit) bytes"))
        case .timeout:
            writer.fail(.requestTimeout("the client stopped sending its request body"))
        case .shuttingDown:
            writer.fail(GatewayError(.shuttingDown, message: "the gateway is shutting down"))
        }
    }
}
