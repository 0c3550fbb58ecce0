extension UpstreamConfig {
    /// `upstreams.NAME`; nil when `url` is missing or invalid (other problems are reported
    /// and the default kept, so one pass reports them all).
    static func parse(_ m: ConfigMapping, name: String) -> UpstreamConfig? {
        let url = m.required("url")?.url(allowQuery: false)
        var c = UpstreamConfig(name: name, url: url ?? .init(fileURLWithPath: "/"))
        m.read("transport", into: &c.transport) { $0.choice(Transport.self) }
        m.read("connect_timeout", into: &c.connectTimeout) { $0.duration(positive: true) }
        m.read("timeout", into: &c.timeout) { $0.duration(positive: true) }
        m.read("max_connections", into: &c.maxConnections) { $0.int(in: 1...Int.max) }
        if let node = m.value("idle_timeout") {
            if c.transport == .urlsession {
                node.error("the urlsession transport keeps idle connections as libcurl decides; use transport: nio to set it")
            } else if let timeout = node.duration(positive: true) {
                c.idleTimeout = timeout
            }
        }
        m.read("preserve_host", into: &c.preserveHost) { $0.bool() }
        m.read("max_response_bytes", into: &c.maxResponseBytes) { $0.size() }
        if m.value("max_response_bytes") == nil && c.transport == .nio {
            // Streams on `nio` flow at the client's pace: no size is a memory risk.
            c.maxResponseBytes = .max
        }
        if let tlsNode = m.value("tls"), let tls = tlsNode.mapping() {
            c.tls = TLSClientConfig.parse(tls, transport: c.transport)
            if let url, url.scheme?.lowercased() != "https" {
                tlsNode.error("applies to https:// URLs only")
            }
        }
        m.finish()
        return url == nil ? nil : c
    }
}
