/// Applies a route's `strip_prefix` just before the endpoint, so middleware see the client's target.
struct PrefixStripping: Responder {
    /// The matched `path_prefix`.
    let prefix: String
    let endpoint: any Responder

    func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        try await endpoint.respond(to: stripped(request), context: context)
    }

    func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse? {
        try endpoint.respondImmediately(to: stripped(request), context: context)
    }

    var answersImmediately: Bool { endpoint.answersImmediately }

    private func stripped(_ request: GatewayRequest) -> GatewayRequest {
        var stripped = request
        stripped.head.path = Self.strip(prefix, from: request.target)
        return stripped
    }

    /// `target` less `prefix` (a trailing `/` of the prefix kept in the result): `/api/x` → `/x`,
    /// `/api` → `/`, `/api?q` → `/?q`. A target that does not start with it is returned as is.
    static func strip(_ prefix: String, from target: String) -> String {
        var trimmedPrefix = Substring(prefix)
        if trimmedPrefix.hasSuffix("/") { trimmedPrefix = trimmedPrefix.dropLast() }
        guard target.hasPrefix(trimmedPrefix) else { return target }
        let rest = target.dropFirst(trimmedPrefix.count)
        if rest.isEmpty { return "/" }
        if rest.first == "?" { return "/" + rest }
        return String(rest)
    }
}
