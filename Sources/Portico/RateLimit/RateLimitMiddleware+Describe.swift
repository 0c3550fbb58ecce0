import HTTPTypes

extension RateLimitMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        let key = config.key.map(\.description).joined(separator: " + ")
        let rate = config.rateText
        let waits = config.onLimit == .wait
        let overLimit = waits
            ? "waits for its token up to \(config.maxWait.configText) (never past its deadline, at most "
                + "\(config.maxWaiting) waiting at once); 429 rate_limited at once when the token is further away or the queue is full"
            : "429 rate_limited"
        var settings = "key \(key), \(rate), burst \(config.burst), missing key: \(config.missingKey.rawValue)"
        if waits { settings += ", on limit: wait up to \(config.maxWait.configText), max waiting \(config.maxWaiting)" }
        if waits, let header = config.priorityHeader { settings += ", priority: header:\(header)" }
        var description = StepDescription(
            settings: settings,
            answersAtOnce: waits ? "429 rate_limited when the token is further away than \(config.maxWait.configText) "
                + "or \(config.maxWaiting) requests already wait" : "429 rate_limited when the bucket is empty")
        if let request {
            var over = "; over the limit a request " + overLimit
            if waits, let header = config.priorityHeader {
                let value = HTTPField.Name(header).flatMap { request.request.headerFields[$0] }
                over += "; it waits as priority \(WaitPriority(headerValue: value)) (header \(header)): higher priorities go first"
            }
            if let value = Self.key(for: request.request, parts: config.key, route: request.context.route) {
                let shown = value.replacingOccurrences(of: "\u{0}", with: " + ")
                description.action = "takes a token from the bucket of key \"\(shown)\" (\(key)): "
                    + "\(config.burst) at once, refilled at \(rate)" + (waits ? over : "")
            } else if config.missingKey == .reject {
                description.action = "answers 400 rate_limit_key_missing: the request has no \(key)"
            } else {
                description.action = "takes a token from the bucket all requests without \(key) share" + (waits ? over : "")
            }
        }
        return description
    }
}

extension RateLimitConfig {
    /// The rate as the configuration writes it: `10/s`, `100/m`, `5/10s`.
    var rateText: String {
        let count = rate.count == rate.count.rounded() ? String(Int(rate.count)) : String(rate.count)
        let per: String = switch rate.per {
        case .seconds(1): "s"
        case .seconds(60): "m"
        default: rate.per.configText
        }
        return "\(count)/\(per)"
    }
}
