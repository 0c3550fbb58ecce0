import NIOCore
import Testing
@testable import Portico

/// `WebSocketFrameTracker`: where a relayed byte stream stands between frames, however the bytes
/// are split, so a close frame of Portico's own never lands inside one.
@Suite("WebSocket frame boundaries")
struct WebSocketFrameTrackerTests {
    /// A frame: FIN + opcode, the length in the shortest form, masked (a client's) or not.
    static func frame(opcode: UInt8 = 0x2, payload: Int, masked: Bool) -> [UInt8] {
        var bytes: [UInt8] = [0x80 | opcode]
        let mask: UInt8 = masked ? 0x80 : 0
        if payload < 126 {
            bytes.append(mask | UInt8(payload))
        } else if payload <= 0xFFFF {
            bytes += [mask | 126, UInt8(payload >> 8), UInt8(payload & 0xFF)]
        } else {
            bytes.append(mask | 127)
            bytes += (0..<8).reversed().map { UInt8(truncatingIfNeeded: UInt64(payload) >> (8 * UInt64($0))) }
        }
        if masked { bytes += [1, 2, 3, 4] }
        return bytes + [UInt8](repeating: 0x55, count: payload)
    }

    @Test("at a boundary after each whole frame, and not inside one, for 7-bit, 16-bit and 64-bit lengths",
          arguments: [(5, false), (5, true), (125, true), (126, false), (300, true), (70_000, false), (70_000, true)])
    func boundaries(payload: Int, masked: Bool) {
        let bytes = Self.frame(payload: payload, masked: masked) + Self.frame(opcode: 0x9, payload: 0, masked: masked)
        var tracker = WebSocketFrameTracker()
        #expect(tracker.atBoundary)
        let first = Self.frame(payload: payload, masked: masked).count
        // Byte by byte: a boundary exactly after each frame.
        for (index, byte) in bytes.enumerated() {
            [byte].withUnsafeBytes { tracker.consume($0) }
            let end = index + 1
            #expect(tracker.atBoundary == (end == first || end == bytes.count), "after \(end) of \(bytes.count)")
        }
    }

    @Test("split anywhere, in ByteBuffers: the same answer as whole")
    func splits() {
        let bytes = Self.frame(payload: 200, masked: true) + Self.frame(opcode: 0x1, payload: 3, masked: true)
        for cut in 1..<bytes.count {
            var tracker = WebSocketFrameTracker()
            tracker.consume(ByteBuffer(bytes: bytes[..<cut]))
            tracker.consume(ByteBuffer(bytes: bytes[cut...]))
            #expect(tracker.atBoundary, "cut at \(cut)")
        }
    }

    @Test("consumeToBoundary: exactly the rest of the frame in progress, however it is split; 0 between frames")
    func toBoundary() {
        let first = Self.frame(payload: 300, masked: true)
        let bytes = first + Self.frame(opcode: 0x1, payload: 3, masked: true)
        for cut in 1..<first.count {
            var tracker = WebSocketFrameTracker()
            tracker.consume(ByteBuffer(bytes: bytes[..<cut]))
            // The rest arrives with the next frame behind it: only the rest is the frame's.
            #expect(tracker.consumeToBoundary(ByteBuffer(bytes: bytes[cut...])) == first.count - cut, "cut at \(cut)")
            #expect(tracker.atBoundary)
            #expect(tracker.consumeToBoundary(ByteBuffer(bytes: bytes[first.count...])) == 0)
        }
        // Still short of the end: all of it.
        var tracker = WebSocketFrameTracker()
        tracker.consume(ByteBuffer(bytes: first[..<10]))
        #expect(tracker.consumeToBoundary(ByteBuffer(bytes: first[10..<100])) == 90)
        #expect(!tracker.atBoundary)
    }

    @Test("Portico's close frames: 1001 unmasked to the client, masked to the upstream")
    func closeFrames() {
        #expect(Array(buffer: WebSocketCloseFrame.toClient(code: 1001)) == [0x88, 0x02, 0x03, 0xE9])
        let masked = Array(buffer: WebSocketCloseFrame.toUpstream(code: 1001))
        #expect(masked.count == 8)
        #expect(masked[0] == 0x88 && masked[1] == 0x82)
        #expect([masked[6] ^ masked[2], masked[7] ^ masked[3]] == [0x03, 0xE9])
    }
}
