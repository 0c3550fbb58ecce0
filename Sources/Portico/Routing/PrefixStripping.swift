/// Applies a route's `strip_prefix` just before the endpoint, so middleware see the client's target.
struct PrefixStripping: Responder {
    /// The matched `path_prefix`.
    let prefix: String
    let endpoint: any Responder

    nonisolated(nonsending) func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        try await endpoint.respond(to: stripped(request), context: context)
    }

    func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse? {
        guard endpoint.answersImmediately else { return nil }
        return try endpoint.respondImmediately(to: stripped(request), context: context)
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
        // By bytes, not Characters: it runs on every request of a route that strips.
        var trimmedPrefix = prefix.utf8[...]
        if trimmedPrefix.last == UInt8(ascii: "/") { trimmedPrefix = trimmedPrefix.dropLast() }
        guard target.utf8.starts(with: trimmedPrefix) else { return target }
        let rest = target.utf8.dropFirst(trimmedPrefix.count)
        guard let first = rest.first else { return "/" }
        if first == UInt8(ascii: "?") { return "/" + String(Substring(rest)) }
        return String(Substring(rest))
    }
}
