import HTTPTypes

/// `type: auth`: adds a credential's header to the upstream request.
///
/// A 401 from further in means the upstream no longer accepts the token (revoked, rotated,
/// clock skew): that exact token is invalidated, a fresh one fetched (once, shared with any
/// concurrent request that saw the same 401) and the request replayed once. A second 401
/// goes back to the client; it never loops. Only a buffered (replayable) request is replayed:
/// with a streamed body, the 401 goes back to the client.
public struct AuthMiddleware: Middleware {
    public let provider: any CredentialProvider
    public let clientHeader: AuthConfig.ClientHeaderPolicy

    public init(provider: any CredentialProvider, clientHeader: AuthConfig.ClientHeaderPolicy = .override) {
        self.provider = provider
        self.clientHeader = clientHeader
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        if clientHeader == .keepIfPresent, request.headerFields[provider.headerName] != nil {
            // The client brought its own credential: its 401s are its own business.
            return try await next(request, context)
        }
        context.stats.update { $0.credential = provider.name }
        let credential = try await provider.header(context: context)
        let response = try await next(Self.inject(credential, into: request), context)
        guard response.status == .unauthorized else { return response }
        guard request.body.isReplayable else {
            // A streamed upload was consumed as it was sent: the 401 goes back as it is.
            context.logger.debug("request body is streamed: 401 not replayed")
            return response
        }
        guard context.remaining > .zero, await provider.invalidate(credential) else { return response }
        // The 401 is replaced: a streamed body of it is cancelled, releasing its connection.
        response.discardBody(GatewayError(.clientClosedRequest, message: "the 401 was discarded for a replay"))
        let fresh = try await provider.header(context: context)
        return try await next(Self.inject(fresh, into: request), context)
    }

    /// Replaces every field of that name the client sent.
    static func inject(_ credential: CredentialHeader, into request: GatewayRequest) -> GatewayRequest {
        var request = request
        // Never indexed: a credential must not end up in an HPACK/QPACK dynamic table.
        var field = HTTPField(name: credential.name, value: credential.value)
        field.indexingStrategy = .avoid
        request.headerFields[fields: credential.name] = [field]
        return request
    }
}
