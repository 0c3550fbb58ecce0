import AsyncHTTPClient
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import NIOCore
import NIOHTTP1

/// Token calls through AsyncHTTPClient (`credentials.NAME.transport: nio`), with the
/// credential's `tls:` settings. Redirects are not followed, so the secret never travels to
/// another host; the body is bounded by `limit`.
final class NIOTokenTransport: TokenTransport {
    private let client: HTTPClient
    private let tls: TLSClientConfig
    private let timeout: Duration
    private let limit: Int

    init(tokenURL: URL, tls: TLSClientConfig, timeout: Duration, limit: Int) {
        var configuration = HTTPClient.Configuration.portico(tls: tls, connectTimeout: timeout, readTimeout: timeout)
        configuration.dnsOverride = tls.addressing(tokenURL).dnsOverride
        self.client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: configuration)
        self.tls = tls
        self.timeout = timeout
        self.limit = limit
    }

    func post(_ request: URLRequest) async throws(TokenEndpointError) -> (Int, Data) {
        guard let url = request.url else { throw TokenEndpointError(.transport("no token URL")) }
        var outbound = HTTPClientRequest(url: tls.addressing(url).url.absoluteString)
        outbound.method = .POST
        for (name, value) in request.allHTTPHeaderFields ?? [:] {
            outbound.headers.add(name: name, value: value)
        }
        // The configured authority, also when `server_name` addresses the URL differently.
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

    func shutdown() {
        client.shutdown { _ in }  // a second call reports "already shut down": nothing to do
    }
}
