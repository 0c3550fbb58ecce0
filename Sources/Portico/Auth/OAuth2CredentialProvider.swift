import HTTPTypes

/// `type: oauth2_client_credentials` and `oauth2_refresh_token`: `Authorization: Bearer <token>`
/// from a `TokenManager`.
public struct OAuth2CredentialProvider: CredentialProvider {
    public let manager: TokenManager
    public var name: String { manager.name }
    public var headerName: HTTPField.Name { .authorization }

    public init(manager: TokenManager) {
        self.manager = manager
    }

    public func header(context: RequestContext) async throws -> CredentialHeader {
        let token = try await manager.token()
        return CredentialHeader(name: .authorization, value: token.headerValue, token: token.value)
    }

    /// Drops exactly the token that was rejected; a newer one is kept.
    public func invalidate(_ header: CredentialHeader) async -> Bool {
        guard let token = header.token else { return false }
        await manager.invalidate(token: token)
        return true
    }

    public func shutdown() async {
        await manager.shutdown()
    }
}
