// The token endpoint lives with the demo, which ships in the `portico` binary; tests know it by
// its testing name.
@_exported import PorticoDemo

public typealias TestTokenEndpoint = TokenEndpointServer

extension TokenEndpointServer {
    /// Waits until at least `count` requests have arrived.
    public func waitForCalls(_ count: Int, timeout: Duration = .seconds(30)) async throws {
        try await Eventually.wait(timeout: timeout, "\(count) token endpoint call(s)") { self.callCount >= count }
    }

    /// Waits until at least `count` requests are held by `.hang`.
    public func waitForHung(_ count: Int, timeout: Duration = .seconds(30)) async throws {
        try await Eventually.wait(timeout: timeout, "\(count) hung token request(s)") { self.hungCount >= count }
    }
}
