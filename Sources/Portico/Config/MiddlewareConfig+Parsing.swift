extension MiddlewareConfig {
    /// `middleware.NAME`, dispatched on `type:` to the registry's kind.
    static func parse(_ m: ConfigMapping, names: ConfigNames, registry: MiddlewareRegistry) -> MiddlewareConfig? {
        guard let typeNode = m.required("type"), let type = typeNode.scalar() else { return nil }
        guard let kind = registry.kind(named: type.text) else {
            let supported = registry.typeNames
            let hint = type.shown.hasPrefix("value from") ? "" : NameSuggester.hint(for: type.text, in: supported)
            typeNode.error("unknown middleware type \(type.shown)\(hint); supported: "
                + supported.joined(separator: ", "))
            return nil  // the other keys depend on the type: checking them would only add noise
        }
        let result = kind.parseConfig(m, names: names)
        m.finish()
        return result
    }
}

extension MiddlewareKind {
    /// `parse`, wrapped with the kind that knows the settings.
    fileprivate func parseConfig(_ m: ConfigMapping, names: ConfigNames) -> MiddlewareConfig? {
        parse(m, names: names).map { MiddlewareConfig(self, $0) }
    }
}
