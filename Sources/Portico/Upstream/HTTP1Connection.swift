import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// One HTTP/1.1 connection of an `HTTP1ConnectionPool`: a channel whose pipeline is
/// TLS (`NIOSSLClientHandler` + `ServerNameVerificationHandler`), NIO's HTTP/1 client codec and
/// an `HTTP1ExchangeHandler`. The handlers live on the channel's event loop; this type only
/// holds the channel and reaches them through the loop.
struct HTTP1Connection: Sendable {
    /// How to reach and verify the upstream.
    struct Endpoint: Sendable {
        var host: String
        var port: Int
        /// `nil`: plain HTTP.
        var tls: NIOSSLContext?
        /// The name sent as SNI and required of the certificate (`ServerNameCheck`); `nil`: none.
        var serverName: String?
    }

    let channel: any Channel

    /// Connects and, with TLS, completes the handshake and the name check, all within `timeout`.
    static func connect(to endpoint: Endpoint, on group: any EventLoopGroup, timeout: Duration) async throws -> HTTP1Connection {
        let timeout = TimeAmount(timeout)
        // The promise exists before the channel, so its outcome (a TLS failure, say) survives
        // the channel closing before anyone asks the pipeline.
        let eventLoop = group.next()
        let ready = eventLoop.makePromise(of: Void.self)
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(timeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    if let context = endpoint.tls {
                        // SNI cannot carry an IP literal; the name check still applies to it.
                        let sni = endpoint.serverName.flatMap { $0.isIPAddressLiteral ? nil : $0 }
                        try pipeline.addHandler(NIOSSLClientHandler(context: context, serverHostname: sni))
                        if let serverName = endpoint.serverName {
                            try pipeline.addHandler(ServerNameVerificationHandler(serverName: serverName))
                        }
                    }
                    try pipeline.addHTTPClientHandlers()
                    let handler = HTTP1ExchangeHandler(ready: ready, awaitsHandshake: endpoint.tls != nil)
                    handler.limitHandshake(to: timeout, on: channel.eventLoop)
                    try pipeline.addHandler(handler)
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            let failure = Self.connectFailure(error)
            ready.fail(failure)  // when the handler never got to it; a no-op otherwise
            throw failure
        }
        let connection = HTTP1Connection(channel: channel)
        do {
            try await withTaskCancellationHandler {
                try await ready.futureResult.get()
            } onCancel: {
                channel.close(promise: nil)
            }
        } catch {
            connection.close()
            throw error
        }
        return connection
    }

    /// Sends one request and returns the response (with a streamed body, at its head);
    /// cancelling the task while it waits closes the connection. A streamed request body is
    /// written part by part after the head, each write awaited (the socket's backpressure);
    /// if it fails, the connection is closed.
    func execute(_ exchange: HTTP1Exchange) async throws -> HTTP1Response {
        let channel = self.channel
        return try await withTaskCancellationHandler {
            let response = try await channel.eventLoop.submit {
                let promise = channel.eventLoop.makePromise(of: HTTP1Response.self)
                do {
                    let handler = try channel.pipeline.syncOperations.handler(type: HTTP1ExchangeHandler.self)
                    handler.execute(exchange, promise: promise)
                } catch {
                    promise.fail(UpstreamError.connectionClosed("pooled connection no longer usable"))
                }
                return promise.futureResult
            }.get()
            if let upload = exchange.upload {
                // After the head was queued on the event loop, so the parts follow it.
                Task {
                    do {
                        try await upload.run { chunk in
                            try await channel.writeAndFlush(HTTPClientRequestPart.body(.byteBuffer(chunk))).get()
                        }
                        try await channel.writeAndFlush(HTTPClientRequestPart.end(nil)).get()
                    } catch {
                        channel.close(promise: nil)
                    }
                }
            }
            return try await response.get()
        } onCancel: {
            channel.close(promise: nil)
        }
    }

    var isActive: Bool { channel.isActive }

    func close() {
        channel.close(promise: nil)
    }

    /// Connect errors → `UpstreamError`, in words (the caller adds the address).
    private static func connectFailure(_ error: any Error) -> any Error {
        switch error {
        case is CancellationError: return error
        case ChannelError.connectTimeout:
            return UpstreamError.connectTimeout
        case let error as NIOConnectionError:
            if error.connectionErrors.contains(where: { if case ChannelError.connectTimeout = $0.error { true } else { false } }) {
                return UpstreamError.connectTimeout
            }
            return UpstreamError.connectFailed(NetworkFailure.describe(nioConnectError: error) ?? "connection failed")
        case let error as IOError:
            return UpstreamError.connectFailed(NetworkFailure.describe(errno: error.errnoCode))
        default:
            return HTTP1ExchangeHandler.kind(of: error, afterHead: false, limit: 0)
        }
    }
}

extension String {
    /// An IPv4 or IPv6 address, which cannot be an SNI name.
    var isIPAddressLiteral: Bool {
        (try? SocketAddress(ipAddress: self, port: 0)) != nil
    }
}
