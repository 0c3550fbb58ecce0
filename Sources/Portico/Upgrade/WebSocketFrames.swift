import NIOCore

/// Where a byte stream of WebSocket frames (RFC 6455 §5.2) stands: inside a frame, or between
/// two. The relay forwards bytes as they come and never holds a frame back; it tracks only
/// this, so that a close frame of Portico's own (`1001` on drain and idle timeout) goes in
/// between two frames, never into one. Payload bytes are skipped in bulk; only header bytes (at
/// most 14 a frame) are looked at one by one.
struct WebSocketFrameTracker: Sendable {
    /// Header bytes of the frame being read (up to 14).
    private var header: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    private var headerCount = 0
    /// Bytes of the header still to come once its first two are known (extended length, mask).
    private var headerNeeded = 2
    private var payloadRemaining: UInt64 = 0

    /// Between two frames: a frame of Portico's own may be sent now.
    var atBoundary: Bool { headerCount == 0 && payloadRemaining == 0 }

    mutating func consume(_ buffer: ByteBuffer) {
        buffer.withUnsafeReadableBytes { _ = consume($0, stopAtBoundary: false) }
    }

    mutating func consume(_ bytes: UnsafeRawBufferPointer) {
        _ = consume(bytes, stopAtBoundary: false)
    }

    /// Consumes `buffer` up to the end of the frame in progress: returns how many of its bytes
    /// belong to that frame (all of them when it does not end within `buffer`). Between two
    /// frames already: 0.
    mutating func consumeToBoundary(_ buffer: ByteBuffer) -> Int {
        guard !atBoundary else { return 0 }
        return buffer.withUnsafeReadableBytes { consume($0, stopAtBoundary: true) }
    }

    /// Returns the bytes consumed: all of them, or with `stopAtBoundary` up to the first frame's end.
    private mutating func consume(_ bytes: UnsafeRawBufferPointer, stopAtBoundary: Bool) -> Int {
        var index = 0
        while index < bytes.count {
            if stopAtBoundary && index > 0 && atBoundary { return index }
            if payloadRemaining > 0 {
                let skip = Int(min(payloadRemaining, UInt64(bytes.count - index)))
                payloadRemaining -= UInt64(skip)
                index += skip
                continue
            }
            let byte = bytes[index]
            index += 1
            store(byte, at: headerCount)
            headerCount += 1
            if headerCount == 2 {
                let second = byte
                let length7 = second & 0x7F
                let extended = length7 == 126 ? 2 : (length7 == 127 ? 8 : 0)
                headerNeeded = 2 + extended + (second & 0x80 != 0 ? 4 : 0)
            }
            guard headerCount >= 2, headerCount == headerNeeded else { continue }
            payloadRemaining = payloadLength()
            headerCount = 0
            headerNeeded = 2
        }
        return index
    }

    private mutating func store(_ byte: UInt8, at position: Int) {
        // Only the first two bytes and the extended length (bytes 2...9) are ever read back.
        switch position {
        case 0: header.0 = byte
        case 1: header.1 = byte
        case 2: header.2 = byte
        case 3: header.3 = byte
        case 4: header.4 = byte
        case 5: header.5 = byte
        case 6: header.6 = byte
        case 7: header.7 = byte
        case 8: header.8 = byte
        case 9: header.9 = byte
        default: break
        }
    }

    private func payloadLength() -> UInt64 {
        let length7 = header.1 & 0x7F
        switch length7 {
        case 126:
            return UInt64(header.2) << 8 | UInt64(header.3)
        case 127:
            let bytes = [header.2, header.3, header.4, header.5, header.6, header.7, header.8, header.9]
            return bytes.reduce(0) { $0 << 8 | UInt64($1) }
        default:
            return UInt64(length7)
        }
    }
}

/// Close frames of Portico's own (RFC 6455 §5.5.1): unmasked toward the client (a server's),
/// masked toward the upstream (a client's).
enum WebSocketCloseFrame {
    /// 1001 "going away": the gateway is draining, or the session sat idle.
    static let goingAway: UInt16 = 1001

    static func toClient(code: UInt16) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.writeBytes([0x88, 0x02, UInt8(code >> 8), UInt8(code & 0xFF)])
        return buffer
    }

    static func toUpstream(code: UInt16) -> ByteBuffer {
        let mask = (0..<4).map { _ in UInt8.random(in: 0...255) }
        var buffer = ByteBuffer()
        buffer.writeBytes([0x88, 0x82] + mask + [UInt8(code >> 8) ^ mask[0], UInt8(code & 0xFF) ^ mask[1]])
        return buffer
    }
}
