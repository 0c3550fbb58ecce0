extension AccessLogMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        var parts = ["redacts headers [\(settings.redactHeaders.joined(separator: ", "))]"]
        if !settings.redactQuery.isEmpty { parts.append("query [\(settings.redactQuery.joined(separator: ", "))]") }
        if !settings.includeHeaders.isEmpty { parts.append("includes [\(settings.includeHeaders.joined(separator: ", "))]") }
        var description = StepDescription(settings: parts.joined(separator: "; "))
        if let request {
            let names = (request.request.query ?? "").split(separator: "&").map { $0.split(separator: "=", maxSplits: 1).first.map(String.init) ?? "" }
            let redacted = names.filter { settings.redactQuery.contains($0) }
            description.action = "writes one line for the request"
                + (redacted.isEmpty ? "" : ", with the value of \(redacted.joined(separator: ", ")) in the query redacted")
        }
        return description
    }
}
