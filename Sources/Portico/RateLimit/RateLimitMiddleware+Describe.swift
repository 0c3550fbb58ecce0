extension RateLimitMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        let key = config.key.map(\.description).joined(separator: " + ")
        let count = config.rate.count == config.rate.count.rounded() ? String(Int(config.rate.count)) : String(config.rate.count)
        let per: String = switch config.rate.per {
        case .seconds(1): "s"
        case .seconds(60): "m"
        default: config.rate.per.configText
        }
        let rate = "\(count)/\(per)"
        var description = StepDescription(
            settings: "key \(key), \(rate), burst \(config.burst), missing key: \(config.missingKey.rawValue)",
            answersAtOnce: "429 rate_limited when the bucket is empty")
        if let request {
            if let value = Self.key(for: request.request, parts: config.key, route: request.context.route) {
                let shown = value.replacingOccurrences(of: "\u{0}", with: " + ")
                description.action = "takes a token from the bucket of key \"\(shown)\" (\(key)): "
                    + "\(config.burst) at once, refilled at \(rate)"
            } else if config.missingKey == .reject {
                description.action = "answers 400 rate_limit_key_missing: the request has no \(key)"
            } else {
                description.action = "takes a token from the bucket all requests without \(key) share"
            }
        }
        return description
    }
}
