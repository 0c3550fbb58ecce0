import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// How one token call travels: URLSession (the default) or Portico's pool on SwiftNIO (`transport: nio`,
/// for custom CAs, client certificates and the other TLS settings URLSession on Linux lacks).
protocol TokenTransport: Sendable {
    /// Sends the POST and returns the status and body (at most the transport's limit).
    func post(_ request: URLRequest) async throws(TokenEndpointError) -> (Int, Data)
    /// Cancels calls in flight and releases connections; safe to call more than once.
    func shutdown()
}
