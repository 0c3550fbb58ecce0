extension MiddlewareConfig {
    /// Every `type:` the loader knows. Adding a middleware is one entry here, one case in
    /// `parse`, and a `parse` function next to its config struct.
    static let supportedTypes = ["access_log", "auth", "compress", "rate_limit", "retry"]

    /// `middleware.NAME`, dispatched on `type:`.
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> MiddlewareConfig? {
        guard let typeNode = m.required("type"), let type = typeNode.scalar() else { return nil }
        let result: MiddlewareConfig?
        switch type.text {
        case "access_log": result = AccessLogConfig.parse(m).map(MiddlewareConfig.accessLog)
        case "auth": result = AuthConfig.parse(m, names: names).map(MiddlewareConfig.auth)
        case "retry": result = RetryConfig.parse(m).map(MiddlewareConfig.retry)
        case "rate_limit": result = RateLimitConfig.parse(m).map(MiddlewareConfig.rateLimit)
        case "compress": result = CompressConfig.parse(m).map(MiddlewareConfig.compress)
        default:
            let hint = type.shown.hasPrefix("value from") ? "" : NameSuggester.hint(for: type.text, in: supportedTypes)
            typeNode.error("unknown middleware type \(type.shown)\(hint); supported: "
                + supportedTypes.joined(separator: ", "))
            return nil  // the other keys depend on the type: checking them would only add noise
        }
        m.finish()
        return result
    }
}
