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
        if let node = m.value("host_header"), let host = node.hostHeaderValue() {
            if c.preserveHost {
                node.error("cannot be combined with preserve_host: true, which sends the client's Host instead")
            } else {
                c.hostHeader = host
            }
        }
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

extension ConfigNode {
    /// A `Host` value: `host` or `host:port`, the host a DNS name, an IPv4 address or a
    /// bracketed IPv6 address.
    func hostHeaderValue() -> String? {
        guard let value = scalar() else { return nil }
        let text = value.text
        var host = Substring(text), port: Substring?
        if text.hasPrefix("[") {
            if let close = text.firstIndex(of: "]") {
                host = text[...close]
                let after = text[text.index(after: close)...]
                if !after.isEmpty { port = after.hasPrefix(":") ? after.dropFirst() : "x" }
            }
        } else if let colon = text.lastIndex(of: ":") {
            host = text[..<colon]
            port = text[text.index(after: colon)...]
        }
        let hostValid = !host.isEmpty && host.count <= 253 && host.unicodeScalars.allSatisfy {
            $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || "-.[]:".unicodeScalars.contains($0))
        } && (host.hasPrefix("[") || !host.contains(":"))
        let portValid = port.map { !$0.isEmpty && $0.count <= 5 && $0.allSatisfy(\.isASCII) && Int($0).map { (1...65535).contains($0) } == true } ?? true
        guard hostValid, portValid else {
            error("expected host or host:port, got \(value.shown)")
            return nil
        }
        return text
    }
}
