extension RetryMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        var settings = "\(config.attempts) attempts on [\(config.on.map(\.description).joined(separator: ", "))], "
            + "backoff \(config.backoffBase.configText)..\(config.backoffCap.configText), budget \(Int(config.budget * 100))%"
        if let perTry = config.perTryTimeout { settings += ", per try \(perTry.configText)" }
        if let hedge = config.hedge {
            settings += ", hedge after \(hedge.after) (at least \(hedge.min.configText)), at most \(hedge.maxExtra) extra"
        }
        var description = StepDescription(settings: settings)
        if let request {
            let method = request.request.method.rawValue
            description.action = if !methods.contains(method) {
                "sends \(method) once: not in methods [\(config.methods.joined(separator: ", "))]"
            } else if !request.request.body.isReplayable {
                "sends it once: a streamed body cannot be replayed"
            } else {
                "up to \(config.attempts) attempts while the retry budget allows"
                    + (config.hedge.map { " (and \($0.maxExtra) hedge\($0.maxExtra == 1 ? "" : "s") of an attempt slower than \($0.after))" } ?? "")
            }
        }
        return description
    }
}
