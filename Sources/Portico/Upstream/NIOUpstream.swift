import AsyncHTTPClient
import HTTPTypes
import Logging
import NIOCore
import NIOHTTP1
import Synchronization

/// The `nio` transport: AsyncHTTPClient on SwiftNIO, for throughput. Bodies travel byte for
/// byte (no decompression), redirects are passed through.
///
/// One `HTTPClient` per upstream, all on the process-wide event loop group: the pool size,
/// connect and read timeouts are per-client settings, so a client per upstream is what makes
/// `max_connections` and the timeouts per upstream; it also lets a configuration reload shut
/// down a removed upstream's connections without touching the others. Threads are shared.
final class NIOUpstream: UpstreamClient {
    let config: UpstreamConfig
    private let target: UpstreamTarget
    /// Where requests are addressed: `target`, or with `tls.server_name` as host (`TLSClientConfig.addressing`).
    private let requestTarget: UpstreamTarget
    private let client: HTTPClient
    /// What AsyncHTTPClient logs per request (debug and trace only): a no-op logger unless the
    /// level lets those through, because it attaches its own metadata to the logger per request.
    private let requestLogger: Logger

    init(config: UpstreamConfig, logger: Logger) {
        self.config = config
        self.target = UpstreamTarget(baseURL: config.url)
        requestLogger = logger.logLevel <= .debug ? logger : Logger(label: logger.label, factory: { _ in SwiftLogNoOpLogHandler() })
        // A burst larger than `max_connections` that waits longer than `connect_timeout` for a
        // pooled connection fails with 504.
        var configuration = HTTPClient.Configuration.portico(
            tls: config.tls, connectTimeout: config.connectTimeout, readTimeout: config.timeout,
            connectionPool: .init(idleTimeout: TimeAmount(config.idleTimeout),
                                  concurrentHTTP1ConnectionsPerHostSoftLimit: max(1, config.maxConnections)))
        let addressing = config.tls.addressing(config.url)
        configuration.dnsOverride = addressing.dnsOverride
        let requestTarget = UpstreamTarget(baseURL: addressing.url)
        self.requestTarget = requestTarget
        self.client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration,
                                 backgroundActivityLogger: logger)
    }

    func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        var headers = HTTPHeaders()
        let fields = ForwardingHeaders.upstreamRequestFields(
            request.headerFields, authority: request.head.authority, clientAddress: request.clientAddress,
            upstreamHost: target.authority, preserveHost: config.preserveHost, proto: request.head.scheme ?? "http")
        headers.reserveCapacity(fields.count)
        for field in fields {
            switch field.name.canonicalName {
            // Framing follows the buffered body; `Expect` is moot once the body is here.
            case "content-length", "transfer-encoding", "expect": continue
            default: headers.add(name: field.name.rawName, value: field.value)
            }
        }
        let body = request.body.buffer.flatMap { $0.readableBytes > 0 ? HTTPClient.Body.byteBuffer($0) : nil }
        let outbound: HTTPClient.Request
        do {
            outbound = try HTTPClient.Request(url: requestTarget.urlString(for: request.target),
                                              method: HTTPMethod(rawValue: request.method.rawValue),
                                              headers: headers, body: body)
        } catch {
            throw UpstreamError.protocolError("request not representable: \(type(of: error))").gatewayError(upstream: config.name)
        }

        // AsyncHTTPClient enforces the deadline over the whole exchange, body included, on the
        // event loop; no timer task of ours is needed. It runs on the real clock: the gateway's
        // clock only says how much time is left.
        let deadline = upstreamDeadline(config: config, context: context)
        let remaining = context.clock.now.duration(to: deadline)
        guard remaining > .zero else { throw UpstreamError.timeout.gatewayError(upstream: config.name) }
        let limit = config.maxResponseBytes
        let collector = NIOResponseCollector(limit: limit)
        let task = client.execute(request: outbound, delegate: collector, eventLoop: .indifferent,
                                  deadline: .now() + TimeAmount(remaining), logger: requestLogger)
        do {
            let response = try await withTaskCancellationHandler {
                try await task.futureResult.get()
            } onCancel: {
                task.cancel()
            }
            return Self.makeResponse(response.head, body: request.method == .head ? ByteBuffer() : response.body)
        } catch {
            guard let mapped = Self.classify(error, afterHead: collector.afterHead, limit: limit)?.reaching(target.authority)
            else { throw error }
            mapped.log(upstream: config.name, to: context.logger)
            throw mapped.gatewayError(upstream: config.name)
        }
    }

    func shutdown() async {
        try? await client.shutdown()
    }

    static func makeResponse(_ head: HTTPResponseHead, body: ByteBuffer) -> GatewayResponse {
        var fields = HTTPFields()
        fields.reserveCapacity(head.headers.count)
        for (name, value) in head.headers {
            guard let name = HTTPField.Name(name) else { continue }
            fields.append(HTTPField(name: name, value: value))
        }
        return GatewayResponse(status: HTTPResponse.Status(code: Int(head.status.code)),
                               headerFields: ForwardingHeaders.clientResponseFields(fields), body: Body(body))
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
