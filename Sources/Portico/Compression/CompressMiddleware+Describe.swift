extension CompressMiddleware {
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        var description = StepDescription(
            settings: "gzip level \(config.level), from \(byteSizeText(config.minBytes)), types [\(config.types.map(\.description).joined(separator: ", "))]")
        if let request {
            let values = request.request.headerFields[values: .acceptEncoding]
            let shown = values.isEmpty ? "no Accept-Encoding" : "Accept-Encoding: \(values.joined(separator: ", "))"
            description.action = switch AcceptEncoding(fieldValues: values).choice {
            case .gzip: "the client allows gzip (\(shown)): a listed type of at least \(byteSizeText(config.minBytes)) is compressed"
            case .identity: "the client does not allow gzip (\(shown)): responses go as they are"
            }
        }
        return description
    }
}
