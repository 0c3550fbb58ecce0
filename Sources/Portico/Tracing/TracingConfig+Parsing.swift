import Yams

extension TracingConfig {
    /// `tracing:` — `endpoint` is required; every other key has a default.
    static func parse(_ m: ConfigMapping) -> TracingConfig? {
        let endpoint = m.required("endpoint")?.url(allowQuery: false)
        var wireProtocol = WireProtocol.httpProtobuf
        m.read("protocol", into: &wireProtocol) { node in
            if case .scalar(let scalar) = node.node, scalar.string == "grpc" {
                node.error("OTLP/gRPC is not built into Portico: use http/protobuf (the collector's port 4318)")
                return nil
            }
            return node.choice(WireProtocol.self)
        }
        var c = endpoint.map(TracingConfig.init(endpoint:))
        var sampleRatio = 1.0
        m.read("sample_ratio", into: &sampleRatio) { $0.ratio() }
        var serviceName = "portico"
        m.read("service_name", into: &serviceName) { $0.nonEmptyString() }
        var headers: [(String, String)] = []
        m.read("headers", into: &headers) { $0.exportHeaders() }
        var timeout = Duration.seconds(10)
        m.read("timeout", into: &timeout) { $0.duration(positive: true) }
        var maxQueueSize = 2048
        m.read("max_queue_size", into: &maxQueueSize) { $0.int(in: 1...1_000_000) }
        var scheduleDelay = Duration.seconds(5)
        m.read("schedule_delay", into: &scheduleDelay) { $0.duration(positive: true) }
        m.finish()
        c?.wireProtocol = wireProtocol
        c?.sampleRatio = sampleRatio
        c?.serviceName = serviceName
        c?.headers = headers
        c?.timeout = timeout
        c?.maxQueueSize = maxQueueSize
        c?.scheduleDelay = scheduleDelay
        return c
    }
}

extension ConfigNode {
    /// A number from 0 to 1 (`0.25`), or a percentage (`25%`).
    func ratio() -> Double? {
        guard let value = scalar(expected: "a number from 0 to 1") else { return nil }
        if value.text.hasSuffix("%") { return percentage() }
        guard value.text.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }), let number = Double(value.text),
              (0...1).contains(number) else {
            error("expected a number from 0 to 1 (or a percentage), got \(value.shown)")
            return nil
        }
        return number
    }

    /// Header names and values sent to the collector. The values are secrets (API keys): no
    /// message repeats them.
    func exportHeaders() -> [(String, String)]? {
        guard let headers = mapping() else { return nil }
        var result: [(String, String)] = []
        for entry in headers.entries {
            guard HTTPSyntax.isToken(entry.key) else {
                entry.keyNode.error("invalid header name \(entry.key.quotedForMessage)")
                continue
            }
            if HTTPSyntax.framingHeaders.contains(entry.key.lowercased()) {
                entry.keyNode.error("header \(entry.key.quotedForMessage) is set by the exporter and cannot be configured")
                continue
            }
            if let value = entry.value.headerValue() { result.append((entry.key, value)) }
        }
        return result
    }
}
