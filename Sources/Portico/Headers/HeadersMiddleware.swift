import HTTPTypes

/// `type: headers` — applies `HeadersConfig`'s request rules before calling further in and its
/// response rules to what comes back, like nginx's `proxy_set_header`/`add_header` or Envoy's
/// `request_headers_to_add`.
///
/// It takes part in answering at once (`ImmediateMiddleware`): placed before a `cache`, a hit
/// is still answered on the server's thread, with the response rules applied to it. Placed
/// after a `cache`, the response rules are applied before the response is stored, so a hit
/// repeats the values of the request that filled it: put it outside the cache for per-request
/// values. Errors the gateway answers itself (a 502, a 429) are left as they are.
///
/// Hygiene runs after it: the transport still drops hop-by-hop fields and sets `Host`,
/// `X-Forwarded-*` and `Via` (rules cannot name the fields Portico frames; `check` refuses them).
public struct HeadersMiddleware: ImmediateMiddleware {
    public let config: HeadersConfig

    public init(_ config: HeadersConfig) {
        self.config = config
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: @escaping NextHandler) async throws -> GatewayResponse {
        var response = try await next(rewritten(request, context: context), context)
        applyResponseRules(to: &response, request: request, context: context)
        return response
    }

    public func handleImmediately(_ request: GatewayRequest, context: RequestContext,
                                  next: ImmediateNextHandler) throws -> GatewayResponse? {
        // The rewritten request is a copy: a `nil` answer leaves nothing behind for the task path.
        guard var response = try next(rewritten(request, context: context), context) else { return nil }
        applyResponseRules(to: &response, request: request, context: context)
        return response
    }

    @inline(__always)
    private func rewritten(_ request: GatewayRequest, context: RequestContext) -> GatewayRequest {
        guard !config.request.isEmpty else { return request }
        var request = request
        var fields = request.headerFields
        config.request.apply(to: &fields, requestID: context.requestID, clientIP: request.clientAddress,
                             route: context.route, upstream: context.upstream)
        request.headerFields = fields
        return request
    }

    @inline(__always)
    private func applyResponseRules(to response: inout GatewayResponse, request: GatewayRequest, context: RequestContext) {
        guard !config.response.isEmpty else { return }
        config.response.apply(to: &response.headerFields, requestID: context.requestID, clientIP: request.clientAddress,
                              route: context.route, upstream: context.upstream)
    }
}
