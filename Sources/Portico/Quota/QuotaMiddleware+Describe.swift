extension QuotaMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        let key = config.key.isEmpty ? "none" : config.key.map(\.description).joined(separator: " + ")
        let shares = allocations.all.map { "\($0.name) \($0.limit)" }.joined(separator: ", ")
        var description = StepDescription(
            settings: "\(config.limit) a \(config.per.rawValue) (\(config.timeZone.identifier)), key \(key), "
                + "allocations \(shares), store \(config.store), on store error: \(config.onStoreError.rawValue)",
            answersAtOnce: "429 quota_exhausted when the request's allocation is spent for this \(config.per.rawValue)")
        if let request {
            let allocation = allocation(for: request.request, route: request.context.route)
            let window = windows.window(containing: request.context.clock.wallNow)
            if allocation.limit == 0 {
                description.action = "answers 429 quota_exhausted: allocation \(allocation.name) is 0"
            } else {
                let whose = allocation.name == QuotaConfig.defaultAllocation
                    ? "the pool keys not listed share (default)" : "allocation \(allocation.name)"
                description.action = "counts one request against \(whose): \(allocation.limit) in the \(config.per.rawValue) "
                    + "that resets at \(CalendarWindow.iso8601(window.end))"
            }
        }
        return description
    }
}
