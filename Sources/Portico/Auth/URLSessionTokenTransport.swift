import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Token calls through URLSession, on the same `URLSessionBridge` as the `urlsession` upstream
/// transport: redirects are not followed, and a 401 with a `Basic` challenge completes with
/// the 401 instead of hanging.
final class URLSessionTokenTransport: TokenTransport {
    private let bridge: URLSessionBridge
    private let limit: Int

    init(backstopSeconds: Int, limit: Int) {
        bridge = URLSessionBridge(backstopSeconds: backstopSeconds)
        self.limit = limit
    }

    func post(_ request: URLRequest) async throws(TokenEndpointError) -> (Int, Data) {
        do {
            let received = try await bridge.run(request, limit: limit)
            return (received.response.statusCode, Data(received.body.readableBytesView))
        } catch let failure as URLSessionBridge.Failure {
            throw Self.tokenError(failure)
        } catch {
            // Cancelled: the token manager's timeout.
            throw TokenEndpointError(.timeout)
        }
    }

    func shutdown() {
        bridge.shutdown()
    }

    /// What the bridge reports, as a token call failure; never the URL (it can carry secrets).
    static func tokenError(_ failure: URLSessionBridge.Failure) -> TokenEndpointError {
        switch failure {
        case .tooLarge(let limit):
            return TokenEndpointError(.malformed("response larger than \(limit) bytes"))
        case .shutDown:
            return TokenEndpointError(.transport("the credential was shut down"))
        case .challengeWithoutResponse:
            return TokenEndpointError(.transport("authentication challenge without a response"))
        case .noResponse:
            return TokenEndpointError(.transport("bad response"))
        case .truncated:
            return TokenEndpointError(.transport("connection closed before the body was complete"))
        case .transport(let error as URLError, _):
            // On Linux a TLS failure is URLError -1 with curl's message, reduced to its reason.
            if let tls = TLSFailure.describe(curlMessage: error.localizedDescription) {
                return TokenEndpointError(.transport("TLS failure: \(tls)"))
            }
            return TokenEndpointError(.transport(NetworkFailure.describe(error.code)))
        case .transport:
            return TokenEndpointError(.transport("request failed"))
        }
    }
}
