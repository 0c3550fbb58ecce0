import Crypto
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
        // SHA-1 because RFC 6455 fixes it for Sec-WebSocket-Accept (it protects nothing).
        let accept = Data(Insecure.SHA1.hash(data: Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8))).base64EncodedString()
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

