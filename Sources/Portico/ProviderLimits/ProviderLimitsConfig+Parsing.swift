extension ProviderLimitsConfig {
    /// `provider_limits:` — every key optional.
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> ProviderLimitsConfig {
        var c = ProviderLimitsConfig()
        m.read("scope", into: &c.scope) { $0.providerLimitScope() }
        m.read("when_exhausted", into: &c.whenExhausted) { $0.choice(WhenExhausted.self) }
        m.read("max_wait", into: &c.maxWait) { $0.duration(positive: true) }
        m.read("max_scopes", into: &c.maxScopes) { $0.int(in: 1...10_000_000) }
        m.read("default_hold", into: &c.defaultHold) { $0.duration(positive: true) }
        m.read("store", into: &c.store) { $0.reference(to: "store", among: names.stores) }
        m.finish()
        return c
    }
}

extension ConfigNode {
    /// `upstream`, `route` or `header:NAME`.
    func providerLimitScope() -> ProviderLimitsConfig.Scope? {
        guard let value = scalar(expected: "upstream, route or header:NAME") else { return nil }
        switch value.text {
        case "upstream": return .upstream
        case "route": return .route
        default:
            if let header = headerKeyName(value.text, shown: value.shown) {
                return header.isEmpty ? nil : .header(header)
            }
            let hint = value.shown.hasPrefix("value from") ? "" : NameSuggester.hint(for: value.text, in: ["upstream", "route", "header:"])
            error("unknown scope \(value.shown)\(hint); expected upstream, route or header:NAME")
            return nil
        }
    }
}
