import HTTPTypes
import Logging
import Metrics
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import Synchronization

/// The `nio` transport: Portico's own HTTP/1.1 connection pool on SwiftNIO
/// (`HTTP1ConnectionPool`), for throughput. Bodies travel byte for byte (no decompression),
/// redirects are passed through. Bodies stream both ways: a streamed request body goes up as it
/// arrives (`UpstreamUpload`); a response body larger than `Body.bufferedLimit` or undeclared is
/// handed on as a stream at its head (`StreamedResponseRelay`), a smaller one is collected
/// whole. The route's timeout bounds the wait for the response head only.
///
/// Why not AsyncHTTPClient, which carried it until issue #22: measured side by side, the same
/// exchanges cost 25 % less CPU per proxied request on this pool (bench/RESULTS.md, session 9),
/// which keeps a task, its connection and the response on one event loop, and AsyncHTTPClient
/// cannot require a certificate to name `tls.server_name` (`HTTP1ConnectionPool` says why).
/// One pool per upstream: `max_connections` and `connect_timeout` are per upstream, and a
/// reload shuts down a removed upstream's connections without touching the others. The pool
/// keeps a share per event loop of `loops` (the loops the gateway's tasks run on), so a request
/// leases and releases its connection on its own loop without a lock.
///
/// A request that fails on a reused connection before any byte of its response goes out once
/// more on a new one where that is safe (`StaleConnection`), counted in
/// `portico_upstream_stale_retries_total{upstream}`; no `retry` middleware is needed for it.
final class NIOUpstream: UpstreamClient {
    let config: UpstreamConfig
    private let target: UpstreamTarget
    private let exchanger: Exchanger

    private enum Exchanger {
        case pool(HTTP1ConnectionPool)
        /// `protocol: http2 | auto`: streams on HTTP/2 connections; `http1` carries upgrade
        /// requests (no WebSocket over HTTP/2 here) and, with `auto`, everything once ALPN has
        /// said no to h2.
        case http2(HTTP2ConnectionPool, http1: HTTP1ConnectionPool)
        /// The URL or its TLS settings make no endpoint: every exchange fails with the reason
        /// (as a TLS error when it is the TLS settings) rather than going out unverified.
        case unusable(HTTP1Connection.Endpoint.Unusable)
    }

    init(config: UpstreamConfig, logger: Logger, loops: EventLoops = .shared,
         metricsFactory: any MetricsFactory = MetricsSystem.factory) {
        self.config = config
        var target = UpstreamTarget(baseURL: config.url)
        if let authority = config.requestAuthority { target.authority = authority }
        self.target = target
        let capName = "upstreams.\(config.name).max_connections"
        switch HTTP1Connection.Endpoint.make(url: config.url, tls: config.tls) {
        case .success(let endpoint):
            let resends = Counter(label: "portico_upstream_stale_retries_total", dimensions: [("upstream", config.name)],
                                  factory: metricsFactory)
            let http1 = HTTP1ConnectionPool(
                .init(endpoint: endpoint, maxConnections: max(1, config.maxConnections),
                      connectTimeout: config.connectTimeout, idleTimeout: config.idleTimeout,
                      capName: capName, onResend: { resends.increment() }),
                loops: loops)
            guard config.httpProtocol != .http1 else {
                exchanger = .pool(http1)
                break
            }
            // ALPN: h2 alone for `http2`, h2 then http/1.1 for `auto` (the server's choice decides).
            let alpn = config.httpProtocol == .auto ? ["h2", "http/1.1"] : ["h2"]
            switch HTTP1Connection.Endpoint.make(url: config.url, tls: config.tls, alpn: alpn) {
            case .success(let h2Endpoint):
                let refusedRetries = Counter(label: "portico_upstream_http2_refused_retries_total",
                                             dimensions: [("upstream", config.name)], factory: metricsFactory)
                let connections = Meter(label: "portico_upstream_http2_connections", dimensions: [("upstream", config.name)],
                                        factory: metricsFactory)
                let pool = HTTP2ConnectionPool(
                    .init(endpoint: h2Endpoint, http2: config.http2, maxConnections: max(1, config.maxConnections),
                          connectTimeout: config.connectTimeout, capName: capName,
                          onRefusedRetry: { refusedRetries.increment() },
                          onConnection: { opened in opened ? connections.increment() : connections.decrement() }),
                    loops: loops)
                exchanger = .http2(pool, http1: http1)
            case .failure(let reason):
                exchanger = .unusable(reason)
            }
        case .failure(let reason):
            exchanger = .unusable(reason)
        }
    }

    /// `auto` found the upstream without h2 (ALPN): HTTP/1.1 from then on. Written once.
    private let fellBackToHTTP1 = Atomic<Bool>(false)

    /// The protocol requests go out on now (`/upstreams`, the access log's `upstream_protocol`).
    var spokenProtocol: String {
        switch exchanger {
        case .http2 where !fellBackToHTTP1.load(ordering: .relaxed): "h2"
        default: "http/1.1"
        }
    }

    /// HTTP/2 streams and connections open now, summed over the loops (each loop asked on its
    /// own thread); `nil` on an HTTP/1.1 upstream. For the admin listener, off the request path.
    func http2Snapshot() async -> (connections: Int, streams: Int)? {
        guard case .http2(let pool, _) = exchanger else { return nil }
        return await pool.snapshot()
    }

    /// One exchange on the pool its protocol says.
    nonisolated(nonsending) private func execute(_ exchange: HTTP1Exchange) async throws -> HTTP1Response {
        switch exchanger {
        case .pool(let pool):
            return try await pool.execute(exchange)
        case .http2(let pool, let http1):
            if exchange.upgrade || fellBackToHTTP1.load(ordering: .relaxed) { return try await http1.execute(exchange) }
            do {
                return try await pool.execute(exchange)
            } catch let unavailable as HTTP2Unavailable {
                // Before any stream: the request is untouched, and goes out on HTTP/1.1.
                guard config.httpProtocol == .auto else { throw unavailable.failure }
                fellBackToHTTP1.store(true, ordering: .relaxed)
                return try await http1.execute(exchange)
            }
        case .unusable(let reason):
            throw reason.upstreamError
        }
    }

    nonisolated(nonsending) func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        var fields = Self.requestFields(request, config: config, upstreamHost: config.sentHost(target))
        if let upgrade = request.upgrade {
            // Hop-by-hop, so dropped above; an upgrade route forwards the switch it asks for.
            fields.append(("Connection", "Upgrade"))
            fields.append(("Upgrade", upgrade))
        }
        let body = request.body.buffer.flatMap { $0.readableBytes > 0 ? $0 : nil }
        // A streamed request body goes up as it arrives (see `UpstreamUpload` for its timeouts).
        let upload = request.body.isStreamed ? UpstreamUpload(request.body, context: context) : nil
        let deadline = upstreamDeadline(config: config, context: context)
        let remaining = context.clock.now.duration(to: deadline)
        guard remaining > .zero else { throw UpstreamError.timeout.gatewayError(upstream: config.name) }
        let limit = config.maxResponseBytes
        if case .unusable(let reason) = exchanger {
            let failure = reason.upstreamError
            failure.log(upstream: config.name, to: context.logger)
            throw failure.gatewayError(upstream: config.name)
        }
        // Framing follows the body.
        if let upload {
            if let length = upload.length {
                fields.append(("Content-Length", String(length)))
            } else {
                fields.append(("Transfer-Encoding", "chunked"))
            }
        } else if body != nil || !Self.methodsWithoutBody.contains(request.method) {
            fields.append(("Content-Length", String(body?.readableBytes ?? 0)))
        }
        let head = HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: request.method.rawValue),
                                   uri: target.pathAndQuery(for: request.target), headers: HTTPHeaders(fields))
        let upstream = config.name
        if case .http2 = exchanger {
            // The access log's `upstream_protocol` (only for upstreams that may speak HTTP/2: nothing added on HTTP/1.1 ones).
            let spoken = request.upgrade != nil ? "http/1.1" : spokenProtocol
            context.stats.update { values in
                values.extra.removeAll { $0.0 == "upstream_protocol" }
                values.extra.append(("upstream_protocol", spoken))
                values[AttemptSpokeHTTP2.self] = spoken == "h2"
            }
        }
        var exchange = HTTP1Exchange(head: head, body: body, upload: upload, limit: limit,
                                     requestIsHead: request.method == .head) { length, cancel in
            StreamedResponseRelay(length: length, limit: limit, upstream: upstream, context: context, cancel: cancel)
        }
        exchange.upgrade = request.upgrade != nil
        do {
            // The deadline bounds the wait for the response head (a streamed response body then
            // flows under its watchdog); the exchange is cancelled at the deadline, which closes
            // the connection in use. With a streamed request body it counts from the end of the upload.
            let response: HTTP1Response
            if let upload {
                response = try await withUpstreamDeadline(remaining, after: upload, clock: context.clock) { [exchange] in
                    try await self.execute(exchange)
                }
            } else if let loopDeadline = context.clock.eventLoopDeadline(for: deadline) {
                // On a clock NIO's timers keep (the real one) the deadline is a timer on the
                // connection's loop (no task racing a timer: measured 4-6 µs a request).
                exchange.deadline = loopDeadline
                response = try await self.execute(exchange)
            } else {
                response = try await withUpstreamDeadline(deadline, clock: context.clock) { [exchange] in
                    try await self.execute(exchange)
                }
            }
            if let tunnel = response.tunnel {
                var switched = Self.makeResponse(response.head, body: .empty)
                // Hop-by-hop fields, dropped by `makeResponse`: the client's switch needs them back.
                switched.headerFields.append(HTTPField(name: .connection, value: "Upgrade"))
                switched.headerFields.append(HTTPField(name: .upgrade, value: response.head.headers["upgrade"].first
                                                       ?? request.upgrade ?? "websocket"))
                switched.tunnel = tunnel
                return switched
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

    private static let methodsWithoutBody: Set<HTTPRequest.Method> = [.get, .head, .delete, .options, .trace, .connect]

    /// The request header fields for the upstream (`ForwardingHeaders`), without framing: each
    /// exchange frames its body itself. An array, made `HTTPHeaders` once the framing is in:
    /// `HTTPHeaders.add` checks every name it is given byte by byte, and these are
    /// `HTTPField.Name`s, tokens already.
    static func requestFields(_ request: GatewayRequest, config: UpstreamConfig, upstreamHost: String) -> [(String, String)] {
        var fields: [(String, String)] = []
        fields.reserveCapacity(request.headerFields.count + 5)
        ForwardingHeaders.forEachUpstreamField(
            request.headerFields, authority: request.head.authority, clientAddress: request.clientAddress,
            upstreamHost: upstreamHost, preserveHost: config.preserveHost, proto: request.head.scheme ?? "http"
        ) { name, value in
            switch name {
            // Framing follows the buffered body; `Expect` is moot once the body is here.
            case .contentLength, .transferEncoding, .expect: return
            default: fields.append((name.rawName, value))
            }
        }
        return fields
    }

    func shutdown() async {
        switch exchanger {
        case .pool(let pool): pool.shutdown()
        case .http2(let pool, let http1):
            pool.shutdown()
            http1.shutdown()
        case .unusable: break
        }
    }

    func retire() async {
        switch exchanger {
        case .pool(let pool): pool.retire()
        case .http2(let pool, let http1):
            pool.retire()
            http1.retire()
        case .unusable: break
        }
    }

    /// The gateway's response for an upstream head: its fields converted and made the client's
    /// (`ForwardingHeaders.clientResponseFields`) in one pass.
    static func makeResponse(_ head: HTTPResponseHead, body: Body) -> GatewayResponse {
        let fields = ForwardingHeaders.clientResponseFields(
            converting: head.headers.lazy.compactMap { name, value in HTTPField.Name.received(name).map { ($0, value) } },
            connectionValues: head.headers["connection"], count: head.headers.count)
        return GatewayResponse(status: HTTPResponse.Status(code: Int(head.status.code)), headerFields: fields, body: body)
    }

    /// The pool's and NIO's errors → UpstreamError; `nil` for cancellation (rethrown as is).
    /// Details name error kinds only, never header values or URLs.
    static func classify(_ error: any Error, afterHead: Bool, limit: Int) -> UpstreamError? {
        switch error {
        case let error as UpstreamError:
            return error
        case is CancellationError:
            return nil
        case is SPKIPins.Mismatch:
            return afterHead ? .connectionClosed("the connection broke off") : .certificatePinMismatch
        case let refused as HTTP2StreamRefused:
            return refused.failure
        case let lost as HTTP2ConnectionLost:
            return lost.failure
        case let unavailable as HTTP2Unavailable:
            return unavailable.failure
        case let reset as NIOHTTP2Errors.StreamClosed:
            return .connectionClosed("the upstream reset the stream (\(reset.errorCode.name))")
        case let error as any NIOHTTP2Error:
            return .protocolError("HTTP/2: \(type(of: error))")
        case is NIOTooManyBytesError:
            return .responseTooLarge(limit: limit)
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
