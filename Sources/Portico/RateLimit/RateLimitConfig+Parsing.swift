extension RateLimitConfig {
    /// `type: rate_limit`; `rate` is required.
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> RateLimitConfig? {
        let rate = m.required("rate")?.rate()
        var c = RateLimitConfig(rate: rate ?? Rate(count: 1, per: .seconds(1)))
        m.read("key", into: &c.key) { $0.rateLimitKey() }
        m.read("burst", into: &c.burst) { $0.int(in: 1...1_000_000_000) }
        m.read("missing_key", into: &c.missingKey) { $0.choice(MissingKey.self) }
        m.read("headers", into: &c.headers) { $0.bool() }
        m.read("max_keys", into: &c.maxKeys) { $0.int(in: 1...100_000_000) }
        m.read("store", into: &c.store) { $0.reference(to: "store", among: names.stores) }
        if let policyNode = m.value("on_store_error"), let policy = policyNode.choice(StoreErrorPolicy.self) {
            c.onStoreError = policy
            if m.value("store") == nil { policyNode.error("applies only with store: NAME (a shared store)") }
        }
        m.read("on_limit", into: &c.onLimit) { $0.choice(OnLimit.self) }
        for waitKey in ["max_wait", "max_waiting", "priority"] where m.value(waitKey) != nil && c.onLimit != .wait {
            m.value(waitKey)?.error("applies only with on_limit: wait")
        }
        m.read("max_wait", into: &c.maxWait) { $0.duration(positive: true) }
        m.read("max_waiting", into: &c.maxWaiting) { $0.int(in: 1...10_000_000) }
        m.read("priority", into: &c.priorityHeader) { $0.priorityHeader() }
        if m.value("burst") == nil, let rate { c.burst = RateLimitConfig.defaultBurst(for: rate) }
        return rate == nil ? nil : c
    }
}

extension ConfigNode {
    /// `client_ip`, `route`, `header:NAME`, or a list of them combined into one key.
    func rateLimitKey() -> [RateLimitConfig.KeyPart]? {
        if case .sequence = node {
            guard let items = list() else { return nil }
            var parts: [RateLimitConfig.KeyPart] = []
            for item in items {
                guard let part = item.rateLimitKeyPart() else { continue }
                if parts.contains(part) {
                    item.error("duplicate key part \(part.description.quotedForMessage)")
                    continue
                }
                parts.append(part)
            }
            if parts.isEmpty, !items.isEmpty { return nil }
            guard !parts.isEmpty else {
                error("must name at least one of client_ip, route, header:NAME")
                return nil
            }
            return parts
        }
        return rateLimitKeyPart().map { [$0] }
    }

    private func rateLimitKeyPart() -> RateLimitConfig.KeyPart? {
        let words = ["client_ip", "route", "header:"]
        guard let value = scalar(expected: "client_ip, route or header:NAME") else { return nil }
        switch value.text {
        case "client_ip": return .clientIP
        case "route": return .route
        default:
            if let header = headerKeyName(value.text, shown: value.shown) {
                return header.isEmpty ? nil : .header(header)
            }
            let hint = value.shown.hasPrefix("value from") ? "" : NameSuggester.hint(for: value.text, in: words)
            error("unknown rate limit key \(value.shown)\(hint); expected client_ip, route or header:NAME")
            return nil
        }
    }
}

extension ConfigNode {
    /// `priority: header:NAME`: the lower-cased NAME.
    func priorityHeader() -> String? {
        guard let value = scalar(expected: "header:NAME") else { return nil }
        guard let name = headerKeyName(value.text, shown: value.shown) else {
            error("expected header:NAME (a request header whose value is high, normal or low), got \(value.shown)")
            return nil
        }
        return name.isEmpty ? nil : name
    }
}

extension ConfigNode {
    /// The lower-cased NAME of a `header:NAME` key (rate_limit's key, provider_limits' scope);
    /// `nil` when the text is not of that form, `""` (after reporting it) when NAME is no token.
    func headerKeyName(_ text: String, shown: String) -> String? {
        guard text.hasPrefix("header:") else { return nil }
        let name = String(text.dropFirst("header:".count))
        guard HTTPSyntax.isToken(name) else {
            error("invalid header name in \(shown)")
            return ""
        }
        return name.lowercased()
    }
}
