import AsyncHTTPClient
import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// The `nio` transport: AsyncHTTPClient on SwiftNIO, for throughput. Bodies travel byte for
/// byte (no decompression), redirects are passed through. Bodies stream both ways: a streamed
/// request body goes up as it arrives (`UpstreamUpload`); a response body larger than
/// `Body.bufferedLimit` or undeclared is handed on as a stream at its head
/// (`StreamedResponseRelay`), a smaller one is collected whole. The route's timeout bounds the
/// wait for the response head only.
///
/// One `HTTPClient` per upstream, all on the process-wide event loop group: the pool size and
/// the connect timeout are per-client settings, so a client per upstream is what makes
/// `max_connections` and `connect_timeout` per upstream; it also lets a configuration reload shut
/// down a removed upstream's connections without touching the others. Threads are shared.
/// With `tls.server_name`, an `HTTP1ConnectionPool` replaces AsyncHTTPClient (see there why);
/// request building, response shaping and error kinds are the same code for both.
final class NIOUpstream: UpstreamClient {
    let config: UpstreamConfig
    private let target: UpstreamTarget
    private let exchanger: Exchanger
    /// What AsyncHTTPClient logs per request (debug and trace only): a no-op logger unless the
    /// level lets those through, because it attaches its own metadata to the logger per request.
    private let requestLogger: Logger

    /// What carries the exchanges: AsyncHTTPClient, or with `tls.server_name` Portico's own
    /// pool, because only there the certificate can be required to name `server_name`
    /// (`HTTP1ConnectionPool` says why).
    private enum Exchanger {
        case client(HTTPClient)
        case pool(HTTP1ConnectionPool)
        /// The TLS settings could not be turned into a context (the message says why): every
        /// exchange fails as a TLS error rather than going out unverified.
        case unusable(String)
    }

    init(config: UpstreamConfig, logger: Logger) {
        self.config = config
        self.target = UpstreamTarget(baseURL: config.url)
        requestLogger = logger.logLevel <= .debug ? logger : Logger(label: logger.label, factory: { _ in SwiftLogNoOpLogHandler() })
        if let pool = Self.strictServerNamePool(config) {
            self.exchanger = pool
            return
        }
        // A burst larger than `max_connections` that waits longer than `connect_timeout` for a
        // pooled connection fails with 504.
        // No read timeout: the head deadline (`NIOResponseCollector`) and a streamed body's
        // watchdog bound the silences, and a reader pausing the body must not look idle.
        let configuration = HTTPClient.Configuration.portico(
            tls: config.tls, connectTimeout: config.connectTimeout, readTimeout: nil,
            connectionPool: .init(idleTimeout: TimeAmount(config.idleTimeout),
                                  concurrentHTTP1ConnectionsPerHostSoftLimit: max(1, config.maxConnections)))
        self.exchanger = .client(HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration,
                                            backgroundActivityLogger: logger))
    }

    /// The pool for an `https` upstream with `server_name` (and verification on); `nil` otherwise.
    private static func strictServerNamePool(_ config: UpstreamConfig) -> Exchanger? {
        guard config.url.scheme?.lowercased() == "https", let serverName = config.tls.serverName,
              !config.tls.insecureSkipVerify, let host = config.url.host else { return nil }
        guard let tls = config.tls.strictServerNameContext() else {
            return .unusable("cannot set up TLS with these tls: settings")
        }
        let endpoint = HTTP1Connection.Endpoint(host: host, port: config.url.port ?? 443, tls: tls, serverName: serverName)
        return .pool(HTTP1ConnectionPool(.init(endpoint: endpoint, maxConnections: max(1, config.maxConnections),
                                               connectTimeout: config.connectTimeout, idleTimeout: config.idleTimeout),
                                         group: HTTPClient.defaultEventLoopGroup))
    }

    func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        var headers = Self.requestHeaders(request, config: config, upstreamHost: target.authority)
        let body = request.body.buffer.flatMap { $0.readableBytes > 0 ? $0 : nil }
        // A streamed request body goes up as it arrives (see `UpstreamUpload` for its timeouts).
        let upload = request.body.isStreamed ? UpstreamUpload(request.body, context: context) : nil
        let deadline = upstreamDeadline(config: config, context: context)
        let remaining = context.clock.now.duration(to: deadline)
        guard remaining > .zero else { throw UpstreamError.timeout.gatewayError(upstream: config.name) }
        let limit = config.maxResponseBytes
        switch exchanger {
        case .client(let client):
            return try await send(request, headers: headers, body: body, upload: upload, remaining: remaining,
                                  through: client, context: context)
        case .unusable(let reason):
            let failure = UpstreamError.tls(reason)
            failure.log(upstream: config.name, to: context.logger)
            throw failure.gatewayError(upstream: config.name)
        case .pool(let pool):
            // Framing follows the body, as AsyncHTTPClient frames it.
            if let upload {
                if let length = upload.length {
                    headers.add(name: "Content-Length", value: String(length))
                } else {
                    headers.add(name: "Transfer-Encoding", value: "chunked")
                }
            } else if body != nil || !Self.methodsWithoutBody.contains(request.method) {
                headers.add(name: "Content-Length", value: String(body?.readableBytes ?? 0))
            }
            let head = HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: request.method.rawValue),
                                       uri: target.pathAndQuery(for: request.target), headers: headers)
            let upstream = config.name
            let exchange = HTTP1Exchange(head: head, body: body, upload: upload, limit: limit,
                                         requestIsHead: request.method == .head) { length, cancel in
                StreamedResponseRelay(length: length, limit: limit, upstream: upstream, context: context, cancel: cancel)
            }
            do {
                // The pool has no deadline of its own: the task is cancelled at the deadline,
                // which closes the connection in use. The deadline bounds the wait for the
                // response head (a streamed response body then flows under its watchdog); with a
                // streamed request body it counts from the end of the upload.
                let response: HTTP1Response
                if let upload {
                    response = try await withUpstreamDeadline(remaining, after: upload, clock: context.clock) {
                        try await pool.execute(exchange)
                    }
                } else {
                    response = try await withUpstreamDeadline(deadline, clock: context.clock) {
                        try await pool.execute(exchange)
                    }
                }
                return Self.makeResponse(response.head, body: response.stream.map { Body(stream: $0) } ?? Body(response.body))
            } catch {
                upload?.cancel()
                if let failure = upload?.failure { throw failure }
                if Task.isCancelled { throw CancellationError() }
                guard let mapped = Self.classify(error, afterHead: false, limit: limit)?.reaching(target.authority) else {
                    throw error
                }
                mapped.log(upstream: config.name, to: context.logger)
                throw mapped.gatewayError(upstream: config.name)
            }
        }
    }

    private static let methodsWithoutBody: Set<HTTPRequest.Method> = [.get, .head, .delete, .options, .trace, .connect]

    /// The request header fields for the upstream (`ForwardingHeaders`), without framing: each
    /// exchanger frames the buffered body itself.
    static func requestHeaders(_ request: GatewayRequest, config: UpstreamConfig, upstreamHost: String) -> HTTPHeaders {
        var headers = HTTPHeaders()
        let fields = ForwardingHeaders.upstreamRequestFields(
            request.headerFields, authority: request.head.authority, clientAddress: request.clientAddress,
            upstreamHost: upstreamHost, preserveHost: config.preserveHost, proto: request.head.scheme ?? "http")
        headers.reserveCapacity(fields.count)
        for field in fields {
            switch field.name.canonicalName {
            // Framing follows the buffered body; `Expect` is moot once the body is here.
            case "content-length", "transfer-encoding", "expect": continue
            default: headers.add(name: field.name.rawName, value: field.value)
            }
        }
        return headers
    }

    private func send(_ request: GatewayRequest, headers: HTTPHeaders, body: ByteBuffer?, upload: UpstreamUpload?,
                      remaining: Duration, through client: HTTPClient, context: RequestContext) async throws -> GatewayResponse {
        let limit = config.maxResponseBytes
        let collector = NIOResponseCollector(limit: limit, requestIsHead: request.method == .head,
                                             upstream: config.name, context: context)
        let outbound: HTTPClient.Request
        do {
            var outboundBody = body.map { HTTPClient.Body.byteBuffer($0) }
            if let upload {
                outboundBody = .stream(contentLength: upload.length.map { Int64($0) }) { writer in
                    let sent = HTTPClient.defaultEventLoopGroup.any().makePromise(of: Void.self)
                    Task {
                        do {
                            try await upload.run { chunk in try await writer.write(.byteBuffer(chunk)).get() }
                            collector.uploadEnded()
                            sent.succeed()
                        } catch {
                            sent.fail(error)
                        }
                    }
                    return sent.futureResult
                }
            }
            outbound = try HTTPClient.Request(url: target.urlString(for: request.target),
                                              method: HTTPMethod(rawValue: request.method.rawValue),
                                              headers: headers, body: outboundBody)
        } catch {
            throw UpstreamError.protocolError("request not representable: \(type(of: error))").gatewayError(upstream: config.name)
        }

        // AsyncHTTPClient's own deadline would cover the whole exchange, body included, and cut
        // a long stream; the collector bounds the wait for the head instead (on the real clock,
        // on the event loop: the gateway's clock only says how much time is left).
        let task = client.execute(request: outbound, delegate: collector, eventLoop: .indifferent,
                                  deadline: nil, logger: requestLogger)
        collector.start(task, headBudget: remaining, afterUpload: upload != nil)
        do {
            return try await withTaskCancellationHandler {
                try await collector.response()
            } onCancel: {
                task.cancel()
            }
        } catch {
            upload?.cancel()
            if let failure = upload?.failure { throw failure }
            if let error = error as? GatewayError { throw error }
            guard let mapped = Self.classify(error, afterHead: collector.afterHead, limit: limit)?.reaching(target.authority)
            else { throw error }
            mapped.log(upstream: config.name, to: context.logger)
            throw mapped.gatewayError(upstream: config.name)
        }
    }

    func shutdown() async {
        switch exchanger {
        case .client(let client): try? await client.shutdown()
        case .pool(let pool): pool.shutdown()
        case .unusable: break
        }
    }

    static func makeResponse(_ head: HTTPResponseHead, body: Body) -> GatewayResponse {
        var fields = HTTPFields()
        fields.reserveCapacity(head.headers.count)
        for (name, value) in head.headers {
            guard let name = HTTPField.Name(name) else { continue }
            fields.append(HTTPField(name: name, value: value))
        }
        return GatewayResponse(status: HTTPResponse.Status(code: Int(head.status.code)),
                               headerFields: ForwardingHeaders.clientResponseFields(fields), body: body)
    }

    /// AsyncHTTPClient / NIO errors → UpstreamError; `nil` for cancellation (rethrown as is).
    /// Details name error kinds only, never header values or URLs.
    static func classify(_ error: any Error, afterHead: Bool, limit: Int) -> UpstreamError? {
        switch error {
        case let error as UpstreamError:
            return error
        case is CancellationError:
            return nil
        case is NIOTooManyBytesError:
            return .responseTooLarge(limit: limit)
        case let error as HTTPClientError:
            switch error {
            case .deadlineExceeded, .readTimeout, .writeTimeout: return .timeout
            case .connectTimeout, .getConnectionFromPoolTimeout: return .connectTimeout
            case .remoteConnectionClosed: return .connectionClosed("remote closed the connection")
            case .cancelled: return nil
            case .alreadyShutdown: return .connectFailed("client is shut down")
            default: return afterHead ? .protocolError("invalid response") : .connectFailed("request failed")
            }
        case let error as HTTPParserError:
            if case .invalidEOFState = error { return .connectionClosed("closed before the body was complete") }
            return .protocolError("\(error)")
        case let error as IOError:
            let words = NetworkFailure.describe(errno: error.errnoCode)
            return afterHead ? .connectionClosed(words) : .connectFailed(words)
        default:
            // After the head the handshake is long done: a TLS error then is a broken connection.
            if !afterHead, let tls = TLSFailure.describe(nioError: error) { return .tls(tls) }
            if !afterHead, let words = NetworkFailure.describe(nioConnectError: error) { return .connectFailed(words) }
            return afterHead ? .connectionClosed("the connection broke off") : .connectFailed("connection failed")
        }
    }
}
