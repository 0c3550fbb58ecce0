extension CacheMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        var description = StepDescription(
            settings: "\(name): max_bytes \(byteSizeText(config.maxBytes)), max_object_bytes \(byteSizeText(config.maxObjectBytes))",
            answersAtOnce: "a fresh stored response (hit)")
        guard let request else { return description }
        let key = Self.key(for: request.request).replacingOccurrences(of: "\u{0}", with: "")
        switch request.request.method {
        case .get, .head:
            if request.request.headerFields[.range] != nil {
                description.action = "passes a range request through unstored (BYPASS)"
            } else {
                let stored = store.variants(for: Self.key(for: request.request)).count
                description.action = "would look up key \"\(key)\": \(stored) stored variant\(stored == 1 ? "" : "s") now"
                    + (request.request.method == .head ? "; a miss goes upstream unstored" : "")
            }
        case .options, .trace, .connect:
            description.action = "passes \(request.request.method.rawValue) through (BYPASS)"
            description.answersAtOnce = nil  // only GET and HEAD are answered from the store
        default:
            description.action = "forwards \(request.request.method.rawValue); a success invalidates key \"\(key)\""
            description.answersAtOnce = nil
        }
        return description
    }
}
