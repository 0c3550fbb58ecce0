import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import NIOCore
import NIOHTTP1
import NIOPosix

/// Token calls (`credentials.NAME.transport: nio`) through an `HTTP1ConnectionPool`, the one
/// the `nio` upstreams use, with the credential's `tls:` settings (`HTTP1Connection.Endpoint`):
/// so `server_name`, custom CAs and client certificates behave as they do for an upstream.
/// Redirects are not followed, so the secret never travels to another host; the body is
/// bounded by `limit`; the deadline covers the whole exchange, connecting included.
final class NIOTokenTransport: TokenTransport {
    private let pool: Result<HTTP1ConnectionPool, HTTP1Connection.Endpoint.Unusable>
    private let timeout: Duration
    private let limit: Int

    init(tokenURL: URL, tls: TLSClientConfig, timeout: Duration, limit: Int) {
        self.timeout = timeout
        self.limit = limit
        // A token endpoint is called every few minutes: a few connections, closed soon after use.
        pool = HTTP1Connection.Endpoint.make(url: tokenURL, tls: tls).map {
            HTTP1ConnectionPool(.init(endpoint: $0, maxConnections: 4, connectTimeout: timeout, idleTimeout: .seconds(4),
                                      capName: "token endpoint \(tokenURL.host ?? "").max_connections"),
                                loops: .shared)
        }
    }

    func post(_ request: URLRequest) async throws(TokenEndpointError) -> (Int, Data) {
        guard let url = request.url else { throw TokenEndpointError(.transport("no token URL")) }
        let pool: HTTP1ConnectionPool
        switch self.pool {
        case .success(let usable): pool = usable
        case .failure(let reason): throw Self.tokenError(reason.upstreamError)
        }
        let head = HTTPRequestHead(version: .http1_1, method: .POST, uri: Self.pathAndQuery(of: url),
                                   headers: Self.headers(of: request, url: url))
        let body = request.httpBody.map { ByteBuffer(bytes: $0) }
        let limit = self.limit
        let response: HTTP1Response
        do {
            response = try await withUpstreamDeadline(ContinuousClock.now.advanced(by: timeout), clock: SystemClock()) {
                try await pool.execute(head, body: body, limit: limit)
            }
        } catch {
            throw Self.tokenError(NIOUpstream.classify(error, afterHead: false, limit: limit))
        }
        return (Int(response.head.status.code), Data(response.body.readableBytesView))
    }

    /// A failed exchange as a token call's error, in words and never with the token URL;
    /// `nil` (cancelled) counts as a timeout, which is what cancels a token call.
    static func tokenError(_ error: UpstreamError?) -> TokenEndpointError {
        switch error {
        case .timeout?, .connectTimeout?, nil: TokenEndpointError(.timeout)
        case .responseTooLarge(let limit)?: TokenEndpointError(.malformed("response larger than \(limit) bytes"))
        case .tls(let detail)?: TokenEndpointError(.transport("TLS failure: \(detail)"))
        case .certificatePinMismatch?: TokenEndpointError(.transport("TLS failure: \(SPKIPins.mismatchDescription)"))
        case .connectFailed(let detail)?, .connectionClosed(let detail)?, .protocolError(let detail)?:
            TokenEndpointError(.transport(detail))
        }
    }

    /// The request's fields with the framing this transport sets itself: `Host` from the URL,
    /// `Content-Length` from the body.
    static func headers(of request: URLRequest, url: URL) -> HTTPHeaders {
        var headers = HTTPHeaders()
        for (name, value) in request.allHTTPHeaderFields ?? [:]
        where !["host", "content-length", "transfer-encoding"].contains(name.lowercased()) {
            headers.add(name: name, value: value)
        }
        headers.add(name: "Host", value: UpstreamTarget(baseURL: url).authority)
        headers.add(name: "Content-Length", value: String(request.httpBody?.count ?? 0))
        return headers
    }

    /// The request target: the URL's path (`/` when empty) and query, as encoded in the URL.
    static func pathAndQuery(of url: URL) -> String {
        let components = URLComponents(url: url, resolvingAgainstBaseURL: false)
        let path = components?.percentEncodedPath ?? ""
        return (path.isEmpty ? "/" : path) + (components?.percentEncodedQuery.map { "?\($0)" } ?? "")
    }

    func shutdown() {
        if case .success(let pool) = pool { pool.shutdown() }
    }
}
