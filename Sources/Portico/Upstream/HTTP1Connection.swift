import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// One HTTP/1.1 connection of an `HTTP1ConnectionPool`: a channel whose pipeline is, for TLS,
/// `NIOSSLClientHandler` (+ a `PeerCertificateCheckHandler` each for `pin_sha256` and
/// `server_name`), NIO's HTTP/1 client codec and an `HTTP1ExchangeHandler`. The handlers live on
/// the channel's event loop; this type only holds the channel and reaches them through the loop.
struct HTTP1Connection: Sendable {
    /// How to reach and verify the upstream.
    struct Endpoint: Sendable {
        var host: String
        var port: Int
        /// `nil`: plain HTTP.
        var tls: NIOSSLContext?
        /// The name sent as SNI and required of the certificate (`ServerNameCheck`); `nil`: none.
        var serverName: String?
        /// Without `serverName`: the host sent as SNI and verified by NIOSSL (an IP address is
        /// checked against the certificate's IP names instead).
        var verifiedHost: String? = nil
        /// `tls.pin_sha256`: the leaf's key must match (`PeerCertificateCheckHandler`).
        var pins: SPKIPins? = nil

        /// The endpoint for `url`: plain HTTP, or TLS verified as `tls:` says — with
        /// `server_name` (and verification on) the certificate must name it (`ServerNameCheck`);
        /// otherwise the URL's host, by NIOSSL. The upstreams and the token endpoints share it.
        /// `alpn`: the protocols offered by ALPN (HTTP/2's connections); none by default.
        static func make(url: URL, tls: TLSClientConfig, alpn: [String] = []) -> Result<Endpoint, Unusable> {
            guard let host = url.host else { return .failure(.noHost) }
            let isTLS = url.scheme?.lowercased() == "https"
            var endpoint = Endpoint(host: host, port: url.port ?? (isTLS ? 443 : 80), tls: nil, serverName: nil)
            guard isTLS else { return .success(endpoint) }
            endpoint.pins = tls.pins
            if let serverName = tls.serverName, !tls.insecureSkipVerify, tls.verification == .full {
                guard let context = tls.strictServerNameContext(alpn: alpn) else { return .failure(.tlsSettings) }
                endpoint.tls = context
                endpoint.serverName = serverName
            } else {
                var configuration = tls.nioConfiguration
                configuration.applicationProtocols = alpn
                guard let context = try? NIOSSLContext(configuration: configuration) else {
                    return .failure(.tlsSettings)
                }
                endpoint.tls = context
                endpoint.verifiedHost = host
            }
            return .success(endpoint)
        }

        /// Why a URL and its `tls:` settings make no endpoint: every exchange then fails with
        /// this, rather than going out unverified.
        enum Unusable: Error, Sendable, Equatable, CustomStringConvertible {
            case noHost
            case tlsSettings

            var description: String {
                switch self {
                case .noHost: "the URL has no host"
                case .tlsSettings: "cannot set up TLS with these tls: settings"
                }
            }

            /// As an exchange's failure: the TLS settings' as a TLS error.
            var upstreamError: UpstreamError {
                switch self {
                case .noHost: .connectFailed(description)
                case .tlsSettings: .tls(description)
                }
            }
        }
    }

    let channel: any Channel
    /// The pipeline's `HTTP1ExchangeHandler`, kept here rather than looked up per exchange: it
    /// still answers (with the reason the connection closed) once the channel has let it go.
    let handler: NIOLoopBoundBox<HTTP1ExchangeHandler?>

    /// Connects and, with TLS, completes the handshake and the name check, all within `timeout`
    /// (else fails with `failure`: `connectTimeout`, or `timeout` when the request's deadline is sooner).
    static func connect(to endpoint: Endpoint, on group: any EventLoopGroup, timeout: TimeAmount,
                        failure timeoutFailure: UpstreamError = .connectTimeout) async throws -> HTTP1Connection {
        // The promise exists before the channel, so its outcome (a TLS failure, say) survives
        // the channel closing before anyone asks the pipeline.
        // The caller's own loop when it runs on one of the group's (`any()` prefers it): the
        // exchanges of a task then stay on its thread.
        let eventLoop = group.any()
        let ready = eventLoop.makePromise(of: Void.self)
        let handlerBox = NIOLoopBoundBox<HTTP1ExchangeHandler?>.makeEmptyBox(valueType: HTTP1ExchangeHandler.self,
                                                                              eventLoop: eventLoop)
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(timeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try endpoint.addTLSHandlers(to: pipeline)
                    // No outbound header validation: the fields come from `HTTPFields`, whose names are
                    // checked and whose values are made legal when built (measured ~1 µs a request).
                    // `forwardBytes`: what the decoder read past a 101's head goes on to the tunnel's relay.
                    try pipeline.addHTTPClientHandlers(leftOverBytesStrategy: .forwardBytes, enableOutboundHeaderValidation: false)
                    let handler = HTTP1ExchangeHandler(ready: ready, awaitsHandshake: endpoint.tls != nil,
                                                       peerHasClosed: PeerLiveness.hasClosed)
                    handler.limitHandshake(to: timeout, on: channel.eventLoop, failure: timeoutFailure)
                    try pipeline.addHandler(handler)
                    handlerBox.value = handler
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            let failure = Self.connectFailure(error, timeout: timeoutFailure)
            ready.fail(failure)  // when the handler never got to it; a no-op otherwise
            throw failure
        }
        let connection = HTTP1Connection(channel: channel, handler: handlerBox)
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
    nonisolated(nonsending) func execute(_ exchange: HTTP1Exchange) async throws -> HTTP1Response {
        let channel = self.channel
        guard let upload = exchange.upload else {
            // One suspension: the request starts at once when this task runs on the connection's
            // loop (the pool prefers such a connection), and the response resumes the task there.
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    let eventLoop = channel.eventLoop
                    if eventLoop.inEventLoop {
                        start(exchange, answering: continuation)
                    } else {
                        eventLoop.execute { start(exchange, answering: continuation) }
                    }
                }
            } onCancel: {
                channel.close(promise: nil)
            }
        }
        return try await withTaskCancellationHandler {
            let (sent, response) = try await channel.eventLoop.submit {
                let promise = channel.eventLoop.makePromise(of: HTTP1Response.self)
                return (start(exchange, complete: promise.completeWith), promise.futureResult)
            }.get()
            // Refused: the body stays unread, so the request can still go out on another connection.
            guard sent else { return try await response.get() }
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
            return try await response.get()
        } onCancel: {
            channel.close(promise: nil)
        }
    }

    /// `start`, answering the waiting task straight from the handler: no promise and future between.
    private func start(_ exchange: HTTP1Exchange, answering continuation: CheckedContinuation<HTTP1Response, any Error>) {
        start(exchange, complete: { continuation.resume(with: $0) })
    }

    /// Hands `exchange` to the connection's handler. On the channel's event loop. `true`: the
    /// request went out.
    @discardableResult
    private func start(_ exchange: HTTP1Exchange, complete: @escaping HTTP1ExchangeHandler.Completion) -> Bool {
        guard let handler = handler.value else {
            complete(.failure(UpstreamError.connectionClosed("pooled connection no longer usable")))
            return false
        }
        return handler.execute(exchange, complete: complete)
    }

    var isActive: Bool { channel.isActive }

    func close() {
        channel.close(promise: nil)
    }

    /// Connect errors → `UpstreamError`, in words (the caller adds the address).
    static func connectFailure(_ error: any Error, timeout: UpstreamError) -> any Error {
        switch error {
        case is CancellationError: return error
        case ChannelError.connectTimeout:
            return timeout
        case let error as NIOConnectionError:
            if error.connectionErrors.contains(where: { if case ChannelError.connectTimeout = $0.error { true } else { false } }) {
                return timeout
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

extension HTTP1Connection.Endpoint {
    /// With TLS: the client handler (SNI from the name checked, never an IP literal) and the
    /// certificate checks (pins, `server_name`), in that order. One place for both protocols'
    /// connections, so a check cannot be added to one and missed on the other.
    func addTLSHandlers(to pipeline: ChannelPipeline.SynchronousOperations) throws {
        guard let context = tls else { return }
        // SNI cannot carry an IP literal; the name check still applies to it.
        let sni = (serverName ?? verifiedHost).flatMap { $0.isIPAddressLiteral ? nil : $0 }
        try pipeline.addHandler(NIOSSLClientHandler(context: context, serverHostname: sni))
        if let pins {
            try pipeline.addHandler(PeerCertificateCheckHandler(.pins(pins)))
        }
        if let serverName {
            try pipeline.addHandler(PeerCertificateCheckHandler(.serverName(serverName)))
        }
    }
}
