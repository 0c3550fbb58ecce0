extension AuthMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        var description = StepDescription(settings: "credential \(provider.name) into \(provider.headerName.rawName), client header: \(clientHeader.rawValue)")
        if let request {
            description.action = if clientHeader == .keepIfPresent, request.request.headerFields[provider.headerName] != nil {
                "keeps the client's own \(provider.headerName.rawName)"
            } else {
                "sets \(provider.headerName.rawName) from credential \(provider.name); a 401 refreshes it and replays once"
            }
        }
        return description
    }
}
