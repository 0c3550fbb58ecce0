import FlushCoalescing
import NIOCore
import NIOEmbedded
import NIOHTTP2
import NIOTLS
import Synchronization
import Testing
@testable import Portico

/// `HTTP2ConnectionHandler` starting HTTP/2 on a cleartext connection (prior knowledge), on an
/// `EmbeddedChannel`: what it sends first is read back as bytes and parsed here by hand, as a
/// peer would read it (RFC 9113 §3.4, §4.1), not through NIOHTTP2.
@Suite("HTTP/2 connection handler")
struct HTTP2ConnectionHandlerTests {
    struct Frame {
        var type: UInt8
        var stream: UInt32
        var payload: ByteBuffer
    }

    /// Connects a channel with the handler and returns the bytes it wrote: the client preface, then frames.
    static func opening() throws -> (preface: String?, frames: [Frame], channel: EmbeddedChannel) {
        let channel = EmbeddedChannel()
        let box = NIOLoopBoundBox.makeEmptyBox(valueType: HTTP2StreamsHandler.self, eventLoop: channel.eventLoop)
        let handler = HTTP2ConnectionHandler(ready: channel.eventLoop.makePromise(), configuration: HTTP2Config(),
                                             events: .init(settings: { _ in }, goAway: {}), streams: box,
                                             failure: HTTP2Connection.Failure(), isTLS: false)
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
        var bytes = ByteBuffer()
        while var part = try channel.readOutbound(as: ByteBuffer.self) { bytes.writeBuffer(&part) }
        let preface = bytes.readString(length: 24)
        var frames: [Frame] = []
        while bytes.readableBytes >= 9, let high = bytes.readInteger(as: UInt8.self), let low = bytes.readInteger(as: UInt16.self),
              let type = bytes.readInteger(as: UInt8.self), let _ = bytes.readInteger(as: UInt8.self),
              let stream = bytes.readInteger(as: UInt32.self), let payload = bytes.readSlice(length: Int(high) << 16 | Int(low)) {
            frames.append(Frame(type: type, stream: stream & 0x7fff_ffff, payload: payload))
        }
        return (preface, frames, channel)
    }

    @Test("the connection opens with our SETTINGS, then a WINDOW_UPDATE that takes the connection's window to 4 MiB at once")
    func opensTheConnectionWindow() throws {
        let (preface, frames, channel) = try Self.opening()
        // Closing fails the pending connect (its promise must not be left unfulfilled).
        defer { _ = try? channel.finish() }
        #expect(preface == "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        #expect(frames.first?.type == 0x4, "SETTINGS first")
        var settings: [UInt16: UInt32] = [:]
        if var payload = frames.first?.payload {
            while let id = payload.readInteger(as: UInt16.self), let value = payload.readInteger(as: UInt32.self) { settings[id] = value }
        }
        // ENABLE_PUSH 0, MAX_CONCURRENT_STREAMS 0 (none from the server), INITIAL_WINDOW_SIZE 256 KiB, MAX_HEADER_LIST_SIZE 64 KiB.
        #expect(settings == [0x2: 0, 0x3: 0, 0x4: 256 * 1024, 0x6: 64 * 1024])
        // Without it the upstream may send only 65,535 bytes on the whole connection until its first DATA is answered.
        let updates = frames.filter { $0.type == 0x8 && $0.stream == 0 }
        #expect(updates.count == 1)
        var update = updates.first?.payload
        let increment = update?.readInteger(as: UInt32.self).map { $0 & 0x7fff_ffff }
        #expect(increment.map { 65_535 + Int($0) } == 4 * 1024 * 1024)
        #expect(frames.firstIndex { $0.type == 0x8 } == 1, "right after SETTINGS")
    }

    /// What a connection told: its connect's outcome and the pool's SETTINGS events.
    final class Heard: Sendable {
        let ready = Mutex<Int??>(nil)
        let settings = Mutex<[Int?]>([])
        let goAways = Mutex(0)
    }

    /// A handler on a connected `EmbeddedChannel` whose connect outcome and events land in `heard`.
    static func connection(isTLS: Bool) throws -> (EmbeddedChannel, Heard) {
        let channel = EmbeddedChannel()
        let heard = Heard()
        let ready = channel.eventLoop.makePromise(of: Int?.self)
        ready.futureResult.whenSuccess { limit in heard.ready.withLock { $0 = .some(limit) } }
        let box = NIOLoopBoundBox.makeEmptyBox(valueType: HTTP2StreamsHandler.self, eventLoop: channel.eventLoop)
        let handler = HTTP2ConnectionHandler(ready: ready, configuration: HTTP2Config(),
                                             events: .init(settings: { limit in heard.settings.withLock { $0.append(limit) } },
                                                           goAway: {}),
                                             streams: box, failure: HTTP2Connection.Failure(), isTLS: isTLS)
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 443)).wait()
        return (channel, heard)
    }

    /// A server's SETTINGS frame, as bytes (RFC 9113 §6.5).
    static func settingsFrame(_ settings: [(UInt16, UInt32)]) -> ByteBuffer {
        var bytes = ByteBuffer()
        let length = settings.count * 6
        bytes.writeInteger(UInt8(length >> 16))
        bytes.writeInteger(UInt16(length & 0xffff))
        bytes.writeInteger(UInt8(0x4))
        bytes.writeInteger(UInt8(0))
        bytes.writeInteger(UInt32(0))
        for (id, value) in settings {
            bytes.writeInteger(id)
            bytes.writeInteger(value)
        }
        return bytes
    }

    @Test("over TLS the connection is ready when ALPN chose h2, assuming 100 streams; the peer's SETTINGS then set the limit, or lift it")
    func readyBeforeSettingsOverTLS() throws {
        let (channel, heard) = try Self.connection(isTLS: true)
        defer { _ = try? channel.finish() }
        #expect(heard.ready.withLock { $0 } == nil, "not before the handshake")
        channel.pipeline.fireUserInboundEventTriggered(TLSUserEvent.handshakeCompleted(negotiatedProtocol: "h2"))
        #expect(heard.ready.withLock { $0 } == .some(100), "ready with no byte from the server yet")
        var written = ByteBuffer()
        while var part = try channel.readOutbound(as: ByteBuffer.self) { written.writeBuffer(&part) }
        #expect(written.readString(length: 24) == "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

        // The first SETTINGS replace the assumed limit; a later one without the parameter changes nothing.
        try channel.writeInbound(Self.settingsFrame([(0x3, 7)]))
        try channel.writeInbound(Self.settingsFrame([(0x4, 65_535)]))
        try channel.writeInbound(Self.settingsFrame([(0x3, 250)]))
        #expect(heard.settings.withLock { $0 } == [7, 250])

        // First SETTINGS with no stream limit: the pool hears `nil` (no limit but ours).
        let (other, otherHeard) = try Self.connection(isTLS: true)
        defer { _ = try? other.finish() }
        other.pipeline.fireUserInboundEventTriggered(TLSUserEvent.handshakeCompleted(negotiatedProtocol: "h2"))
        try other.writeInbound(Self.settingsFrame([(0x4, 65_535)]))
        #expect(otherHeard.settings.withLock { $0 } == [nil])
    }

    @Test("over TLS, a server that chose h2 but sends no SETTINGS within the connect's timeout: the connection ends with the timeout's failure, told as GOAWAY; SETTINGS in time keep it")
    func settingsDueWithinTheConnectTimeout() throws {
        func connection() throws -> (EmbeddedChannel, HTTP2Connection.Failure, Heard) {
            let channel = EmbeddedChannel()
            let failure = HTTP2Connection.Failure()
            let heard = Heard()
            let box = NIOLoopBoundBox.makeEmptyBox(valueType: HTTP2StreamsHandler.self, eventLoop: channel.eventLoop)
            let handler = HTTP2ConnectionHandler(ready: channel.eventLoop.makePromise(of: Int?.self), configuration: HTTP2Config(),
                                                 events: .init(settings: { _ in }, goAway: { heard.goAways.withLock { $0 += 1 } }),
                                                 streams: box, failure: failure, isTLS: true)
            try channel.pipeline.syncOperations.addHandler(handler)
            handler.limitStart(to: TimeAmount.seconds(5), failure: UpstreamError.connectTimeout, on: channel.eventLoop)
            try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 443)).wait()
            channel.pipeline.fireUserInboundEventTriggered(TLSUserEvent.handshakeCompleted(negotiatedProtocol: "h2"))
            return (channel, failure, heard)
        }

        let (silent, failure, heard) = try connection()
        defer { _ = try? silent.finish() }
        silent.embeddedEventLoop.advanceTime(by: TimeAmount.seconds(4))
        #expect(silent.isActive && failure.recorded == nil, "ready, and still within the timeout")
        silent.embeddedEventLoop.advanceTime(by: TimeAmount.seconds(2))
        #expect(!silent.isActive, "closed")
        #expect(failure.recorded == UpstreamError.connectTimeout, "what its streams' callers hear")
        #expect(heard.goAways.withLock { $0 } == 1, "the pool sends no new stream there")

        let (answered, answeredFailure, answeredHeard) = try connection()
        defer { _ = try? answered.finish() }
        try answered.writeInbound(Self.settingsFrame([(0x3, 100)]))
        answered.embeddedEventLoop.advanceTime(by: TimeAmount.seconds(10))
        #expect(answered.isActive && answeredFailure.recorded == nil && answeredHeard.goAways.withLock { $0 } == 0)
    }

    @Test("in cleartext (prior knowledge) the connection is ready only at the peer's SETTINGS, with their limit")
    func cleartextWaitsForSettings() throws {
        let (channel, heard) = try Self.connection(isTLS: false)
        defer { _ = try? channel.finish() }
        #expect(heard.ready.withLock { $0 } == nil, "no proof yet that the peer speaks HTTP/2")
        try channel.writeInbound(Self.settingsFrame([(0x3, 5)]))
        #expect(heard.ready.withLock { $0 } == .some(5))
        #expect(heard.settings.withLock { $0 }.isEmpty, "told as the connect's outcome, not as a change")
    }

    @Test("over TLS, ALPN choosing anything but h2 fails the connect with HTTP2Unavailable")
    func refusesWithoutH2() throws {
        let channel = EmbeddedChannel()
        let ready = channel.eventLoop.makePromise(of: Int?.self)
        let failed = Mutex(false)
        ready.futureResult.whenFailure { error in failed.withLock { $0 = error is HTTP2Unavailable } }
        let box = NIOLoopBoundBox.makeEmptyBox(valueType: HTTP2StreamsHandler.self, eventLoop: channel.eventLoop)
        try channel.pipeline.syncOperations.addHandler(
            HTTP2ConnectionHandler(ready: ready, configuration: HTTP2Config(), events: .init(settings: { _ in }, goAway: {}),
                                   streams: box, failure: HTTP2Connection.Failure(), isTLS: true))
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 443)).wait()
        channel.pipeline.fireUserInboundEventTriggered(TLSUserEvent.handshakeCompleted(negotiatedProtocol: "http/1.1"))
        #expect(failed.withLock { $0 })
        _ = try? channel.finish()
    }
}

/// `FlushCoalescingHandler` on an `EmbeddedChannel`: flushes within one turn of the loop leave as
/// one, once the loop runs its queued tasks (`run()`); a close flushes first.
@Suite("HTTP/2 connection flush coalescing")
struct FlushCoalescingHandlerTests {
    /// Counts the flushes that reach the socket's end.
    final class FlushCounter: ChannelOutboundHandler {
        typealias OutboundIn = IOData
        var flushes = 0
        func flush(context: ChannelHandlerContext) {
            flushes += 1
            context.flush()
        }
    }

    static func channel() throws -> (EmbeddedChannel, FlushCounter) {
        let channel = EmbeddedChannel()
        let counter = FlushCounter()
        try channel.pipeline.syncOperations.addHandler(counter)
        try channel.pipeline.syncOperations.addHandler(FlushCoalescingHandler())
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
        return (channel, counter)
    }

    static func write(_ text: String, to channel: EmbeddedChannel) {
        channel.pipeline.writeAndFlush(IOData.byteBuffer(ByteBuffer(string: text)), promise: nil)
    }

    @Test("three streams' flushes in one turn reach the socket as one flush, after the turn")
    func coalesces() throws {
        let (channel, counter) = try Self.channel()
        defer { _ = try? channel.finish() }
        for text in ["a", "b", "c"] { Self.write(text, to: channel) }
        #expect(counter.flushes == 0)
        #expect(try channel.readOutbound(as: IOData.self) == nil, "nothing leaves before the turn ends")
        channel.embeddedEventLoop.run()
        #expect(counter.flushes == 1)
        var sent = ""
        while case .byteBuffer(let buffer)? = try channel.readOutbound(as: IOData.self) { sent += String(buffer: buffer) }
        #expect(sent == "abc")
        // The next turn's flush is its own.
        Self.write("d", to: channel)
        channel.embeddedEventLoop.run()
        #expect(counter.flushes == 2)
    }

    @Test("a close right after a write flushes it first: nothing written before the close is dropped")
    func flushesBeforeClose() throws {
        let (channel, counter) = try Self.channel()
        Self.write("goaway", to: channel)
        channel.close(promise: nil)
        #expect(counter.flushes == 1)
        var sent = ""
        while case .byteBuffer(let buffer)? = try channel.readOutbound(as: IOData.self) { sent += String(buffer: buffer) }
        #expect(sent == "goaway")
    }
}
