import Foundation
import MicroHTTPD
import NIOCore
import NIOPosix
import NIOWebSocket
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The demo upstream's WebSocket echo (`/ws/echo`): answers the handshake itself (RFC 6455 §4.2)
/// on the demo's libmicrohttpd server, and once the 101 is sent echoes every message back on
/// the upgraded connection, with NIO's frame codecs. Pings are answered, a close is echoed.
final class DemoWebSocketEcho: ConnectionUpgradeHandler {
    /// The session's channel once it is up, for `serverStopping`.
    private let channel = Mutex<(any Channel)?>(nil)

    /// The handshake's answer for `request`, or `nil` when it is not a WebSocket handshake.
    static func answer(_ request: ServerRequest) -> ServerResponse? {
        guard request.method == "GET", request.header("upgrade")?.lowercased() == "websocket",
              let key = request.header("sec-websocket-key") else { return nil }
        let accept = Data(SHA1.digest(Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))).base64EncodedString()
        return ServerResponse(status: 101, headers: [("Connection", "Upgrade"), ("Upgrade", "websocket"),
                                                     ("Sec-WebSocket-Accept", accept)],
                              payload: .upgrade(DemoWebSocketEcho()))
    }

    func upgraded(_ connection: UpgradedConnection) {
        let bootstrap = ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).channelInitializer { channel in
            channel.eventLoop.makeCompletedFuture {
                let pipeline = channel.pipeline.syncOperations
                try pipeline.addHandler(ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: 1 << 24)))
                try pipeline.addHandler(WebSocketFrameEncoder())
                try pipeline.addHandler(EchoHandler())
            }
        }
        bootstrap.withConnectedSocket(connection.socket).whenComplete { result in
            switch result {
            case .success(let channel):
                self.channel.withLock { $0 = channel }
                channel.closeFuture.whenComplete { _ in connection.close() }
                if !connection.received.isEmpty {
                    var buffer = channel.allocator.buffer(capacity: connection.received.count)
                    buffer.writeBytes(connection.received)
                    channel.pipeline.fireChannelRead(buffer)
                }
            case .failure:
                Glibc.close(connection.socket)
                connection.close()
            }
        }
    }

    func serverStopping() {
        channel.withLock { $0 }?.close(promise: nil)
    }
    func abandoned() {}

    /// Echoes data frames (fragments as they come), answers pings, and echoes a close, then closes.
    private final class EchoHandler: ChannelInboundHandler {
        typealias InboundIn = WebSocketFrame
        typealias OutboundOut = WebSocketFrame

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let frame = unwrapInboundIn(data)
            let payload = frame.unmaskedData
            switch frame.opcode {
            case .text, .binary, .continuation:
                context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: frame.fin, opcode: frame.opcode, data: payload)),
                                      promise: nil)
            case .ping:
                context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .pong, data: payload)), promise: nil)
            case .connectionClose:
                let channel = context.channel
                context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .connectionClose, data: payload)))
                    .assumeIsolated().whenComplete { _ in channel.close(promise: nil) }
            default:
                break
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}

/// SHA-1 (FIPS 180-4), for the handshake's `Sec-WebSocket-Accept` only (RFC 6455 fixes it;
/// it protects nothing).
enum SHA1 {
    static func digest(_ message: [UInt8]) -> [UInt8] {
        var h: [UInt32] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0]
        var bytes = message
        let bitLength = UInt64(message.count) * 8
        bytes.append(0x80)
        while bytes.count % 64 != 56 { bytes.append(0) }
        for shift in stride(from: 56, through: 0, by: -8) { bytes.append(UInt8(truncatingIfNeeded: bitLength >> UInt64(shift))) }
        var w = [UInt32](repeating: 0, count: 80)
        for chunk in stride(from: 0, to: bytes.count, by: 64) {
            for i in 0..<16 {
                let j = chunk + i * 4
                w[i] = UInt32(bytes[j]) << 24 | UInt32(bytes[j + 1]) << 16 | UInt32(bytes[j + 2]) << 8 | UInt32(bytes[j + 3])
            }
            for i in 16..<80 {
                let x = w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]
                w[i] = x << 1 | x >> 31
            }
            var (a, b, c, d, e) = (h[0], h[1], h[2], h[3], h[4])
            for i in 0..<80 {
                let (f, k): (UInt32, UInt32) = switch i {
                case 0..<20: ((b & c) | (~b & d), 0x5A827999)
                case 20..<40: (b ^ c ^ d, 0x6ED9EBA1)
                case 40..<60: ((b & c) | (b & d) | (c & d), 0x8F1BBCDC)
                default: (b ^ c ^ d, 0xCA62C1D6)
                }
                let temp = (a << 5 | a >> 27) &+ f &+ e &+ k &+ w[i]
                (e, d, c, b, a) = (d, c, b << 30 | b >> 2, a, temp)
            }
            h[0] = h[0] &+ a; h[1] = h[1] &+ b; h[2] = h[2] &+ c; h[3] = h[3] &+ d; h[4] = h[4] &+ e
        }
        return h.flatMap { value in (0..<4).map { UInt8(truncatingIfNeeded: value >> (24 - 8 * UInt32($0))) } }
    }
}
