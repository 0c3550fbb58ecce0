import HTTPTypes

/// The header a credential adds to an upstream request. `description` hides the value.
public struct CredentialHeader: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    public var name: HTTPField.Name
    public var value: String
    /// The token behind the value, for `invalidate` (`nil` for fixed credentials).
    public var token: String?

    public init(name: HTTPField.Name, value: String, token: String? = nil) {
        self.name = name
        self.value = value
        self.token = token
    }

    public var description: String { "CredentialHeader(\(name): <redacted>)" }
    public var debugDescription: String { description }
}

/// Supplies one credential's header for upstream requests.
public protocol CredentialProvider: Sendable {
    /// The configured credential's name (metrics, the access log: never its value).
    var name: String { get }
    /// The header this credential sets; known without fetching anything.
    var headerName: HTTPField.Name { get }
    /// The header to send now. Throws `GatewayError` (503 `credentials_unavailable`).
    func header(context: RequestContext) async throws -> CredentialHeader
    /// The upstream rejected `header`. Returns whether asking again can give a different one
    /// (so a replay is worth it): `true` for tokens, `false` for fixed values.
    func invalidate(_ header: CredentialHeader) async -> Bool
    /// Stops background work (token refresh). Called once, when no configuration uses it.
    func shutdown() async
}
