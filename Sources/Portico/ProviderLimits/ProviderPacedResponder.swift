import HTTPTypes

/// The endpoint of a route whose upstream has `provider_limits`: each attempt is admitted by
/// the limiter before it goes and its answer teaches the limiter.
struct ProviderPacedResponder: Responder {
    let limiter: ProviderLimiter
    let endpoint: any Responder

    nonisolated(nonsending)
    func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        let scope = limiter.scope(for: request, context: context)
        let ticket = try await limiter.admit(scope, context: context)
        do {
            let response = try await endpoint.respond(to: request, context: context)
            await limiter.observe(scope, ticket: ticket, status: response.status.code, fields: response.headerFields)
            return response
        } catch {
            await limiter.abandon(scope)
            throw error
        }
    }
}
