import AsyncHTTPClient
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import NIOCore
import NIOHTTP1

/// Token calls through AsyncHTTPClient (`credentials.NAME.transport: nio`), with the
/// credential's `tls:` settings. Redirects are not followed, so the secret never travels to
/// another host; the body is bounded by `limit`. With `tls.server_name` on an `https` token
/// URL the calls go through an `HTTP1ConnectionPool` instead, which requires the certificate
/// to name `server_name` by DNS name (AsyncHTTPClient cannot: see `HTTP1ConnectionPool`).
final class NIOTokenTransport: TokenTransport {
    private let client: HTTPClient?
    private let pool: HTTP1ConnectionPool?
    private let tls: TLSClientConfig
    private let timeout: Duration
    private let limit: Int

    init(tokenURL: URL, tls: TLSClientConfig, timeout: Duration, limit: Int) {
        self.tls = tls
        self.timeout = timeout
        self.limit = limit
        if tokenURL.scheme?.lowercased() == "https", let serverName = tls.serverName, !tls.insecureSkipVerify,
           let host = tokenURL.host {
            // A context that cannot be made leaves `pool` and `client` nil: every call fails as TLS.
            let endpoint = tls.strictServerNameContext().map {
                HTTP1Connection.Endpoint(host: host, port: tokenURL.port ?? 443, tls: $0, serverName: serverName)
            }
            self.pool = endpoint.map {
                HTTP1ConnectionPool(.init(endpoint: $0, maxConnections: 4, connectTimeout: timeout, idleTimeout: .seconds(4)),
                                    group: HTTPClient.defaultEventLoopGroup)
            }
            self.client = nil
            return
        }
        self.pool = nil
        let configuration = HTTPClient.Configuration.portico(tls: tls, connectTimeout: timeout, readTimeout: timeout)
        self.client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
    }

    func post(_ request: URLRequest) async throws(TokenEndpointError) -> (Int, Data) {
        guard let url = request.url else { throw TokenEndpointError(.transport("no token URL")) }
        guard let client else { return try await post(request, url: url, through: pool) }
        var outbound = HTTPClientRequest(url: url.absoluteString)
        outbound.method = .POST
        for (name, value) in request.allHTTPHeaderFields ?? [:] {
            outbound.headers.add(name: name, value: value)
        }
        outbound.headers.replaceOrAdd(name: "Host", value: UpstreamTarget(baseURL: url).authority)
        if let body = request.httpBody { outbound.body = .bytes(ByteBuffer(bytes: body)) }
        do {
            let response = try await client.execute(outbound, deadline: .now() + TimeAmount(timeout))
            let body = try await response.body.collect(upTo: limit)
            return (Int(response.status.code), Data(body.readableBytesView))
        } catch let error as HTTPClientError where error == .deadlineExceeded || error == .readTimeout
            || error == .connectTimeout {
            throw TokenEndpointError(.timeout)
        } catch is NIOTooManyBytesError {
            throw TokenEndpointError(.malformed("response larger than \(limit) bytes"))
        } catch is CancellationError {
            throw TokenEndpointError(.timeout)
        } catch {
            if let tls = TLSFailure.describe(nioError: error) {
                throw TokenEndpointError(.transport("TLS failure: \(tls)"))
            }
            // In words, never the description: it may carry the token URL.
            throw TokenEndpointError(.transport(NetworkFailure.describe(nioConnectError: error) ?? "request failed"))
        }
    }

    /// The same call through Portico's own pool; the deadline covers the whole exchange.
    private func post(_ request: URLRequest, url: URL, through pool: HTTP1ConnectionPool?) async throws(TokenEndpointError)
        -> (Int, Data) {
        guard let pool else { throw TokenEndpointError(.transport("TLS failure: cannot set up TLS with these tls: settings")) }
        var headers = HTTPHeaders()
        for (name, value) in request.allHTTPHeaderFields ?? [:]
        where !["host", "content-length", "transfer-encoding"].contains(name.lowercased()) {
            headers.add(name: name, value: value)
        }
        headers.add(name: "Host", value: UpstreamTarget(baseURL: url).authority)
        let body = request.httpBody.map { ByteBuffer(bytes: $0) }
        headers.add(name: "Content-Length", value: String(body?.readableBytes ?? 0))
        let components = URLComponents(url: url, resolvingAgainstBaseURL: false)
        let path = components?.percentEncodedPath ?? ""
        let uri = (path.isEmpty ? "/" : path) + (components?.percentEncodedQuery.map { "?\($0)" } ?? "")
        let head = HTTPRequestHead(version: .http1_1, method: .POST, uri: uri, headers: headers)
        let limit = self.limit
        let response: HTTP1Response
        do {
            response = try await withUpstreamDeadline(ContinuousClock.now.advanced(by: timeout), clock: SystemClock()) {
                try await pool.execute(head, body: body, limit: limit)
            }
        } catch {
            switch NIOUpstream.classify(error, afterHead: false, limit: limit) {
            case .timeout?, .connectTimeout?, nil: throw TokenEndpointError(.timeout)
            case .responseTooLarge?: throw TokenEndpointError(.malformed("response larger than \(limit) bytes"))
            case .tls(let detail)?: throw TokenEndpointError(.transport("TLS failure: \(detail)"))
            // In words, as the AsyncHTTPClient path says them; never the token URL.
            case .connectFailed(let detail)?, .connectionClosed(let detail)?, .protocolError(let detail)?:
                throw TokenEndpointError(.transport(detail))
            }
        }
        return (Int(response.head.status.code), Data(response.body.readableBytesView))
    }

    func shutdown() {
        client?.shutdown { _ in }  // a second call reports "already shut down": nothing to do
        pool?.shutdown()
    }
}
