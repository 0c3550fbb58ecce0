extension HeadersMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        var description = StepDescription(settings: [("request", config.request), ("response", config.response)]
            .filter { !$0.1.isEmpty }
            .map { "\($0.0): \(Self.summary($0.1))" }
            .joined(separator: "; "))
        if request != nil {
            var actions: [String] = []
            if !config.request.isEmpty { actions.append("rewrites the request's fields before going further in") }
            if !config.response.isEmpty { actions.append("rewrites the response's fields on the way out (a cache hit's too, when placed before the cache)") }
            description.action = actions.joined(separator: ", then ")
        }
        return description
    }

    /// `remove [Server], set [X-A: "${request_id}"], add [X-B]` — templates as written, so an
    /// `${env:NAME}` shows its name, never its value.
    static func summary(_ rules: HeaderRules) -> String {
        var parts: [String] = []
        if !rules.remove.isEmpty { parts.append("remove [\(rules.remove.map(\.rawName).joined(separator: ", "))]") }
        if !rules.set.isEmpty { parts.append("set [\(rules.set.map { "\($0.name.rawName): \($0.value.source.quotedForMessage)" }.joined(separator: ", "))]") }
        if !rules.add.isEmpty { parts.append("add [\(rules.add.map { "\($0.name.rawName): \($0.value.source.quotedForMessage)" }.joined(separator: ", "))]") }
        return parts.joined(separator: ", ")
    }
}
