import Foundation

extension UpstreamConfig {
    /// `upstreams.NAME`; nil when `url` is missing or invalid (other problems are reported
    /// and the default kept, so one pass reports them all).
    static func parse(_ m: ConfigMapping, name: String, names: ConfigNames = ConfigNames()) -> UpstreamConfig? {
        let endpoints = parseEndpoints(m)
        let url = endpoints?.first
        var c = UpstreamConfig(name: name, endpoints: endpoints ?? [.init(fileURLWithPath: "/")])
        m.read("balance", into: &c.balance) { $0.choice(BalanceStrategy.self) }
        m.read("outlier_detection", into: &c.outlierDetection) { $0.mapping().map(OutlierDetectionConfig.parse) }
        c.circuitBreaker = m.value("circuit_breaker")?.mapping().map(CircuitBreakerConfig.parse)
        parseConcurrency(m, into: &c)
        c.providerLimits = m.value("provider_limits")?.mapping().map { ProviderLimitsConfig.parse($0, names: names) }
        c.healthCheck = m.value("health_check")?.mapping().flatMap(HealthCheckConfig.parse)
        m.read("transport", into: &c.transport) { $0.choice(Transport.self) }
        parseProtocol(m, into: &c, url: url)
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
        if let node = m.value("dns_refresh"), let refresh = node.duration(positive: true) {
            if m.value("endpoints") != nil {
                node.error("applies to url: with a host name, not to endpoints")
            } else if let url, url.host.map(SystemResolver.isAddressLiteral) ?? true {
                node.error("applies to url: with a host name, not an address")
            } else if c.transport != .nio, url?.scheme?.lowercased() == "https" {
                node.error("needs transport: nio for an https upstream (urlsession would check the certificate against the address it connects to, not the name)")
            } else {
                c.dnsRefresh = refresh
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

    /// `concurrency: N` (the breaker's `max_requests`, kept as `circuit_breaker.max_requests` too) or
    /// `concurrency: adaptive` (with `adaptive_concurrency: {...}`, which needs it).
    private static func parseConcurrency(_ m: ConfigMapping, into c: inout UpstreamConfig) {
        let adaptiveNode = m.value("adaptive_concurrency")
        let adaptiveSection = adaptiveNode?.mapping().map(AdaptiveConcurrencyConfig.parse)
        guard let node = m.value("concurrency") else {
            adaptiveNode?.error("applies with concurrency: adaptive")
            return
        }
        if node.isWord("adaptive") {
            c.adaptiveConcurrency = adaptiveSection ?? AdaptiveConcurrencyConfig()
            return
        }
        if let adaptiveNode {
            adaptiveNode.error("applies with concurrency: adaptive, not a fixed number")
        }
        guard let limit = node.int(in: 1...1_000_000, expected: "adaptive or a number of requests") else { return }
        if let breaker = m.value("circuit_breaker")?.mapping(), breaker.value("max_requests") != nil {
            node.error("give either concurrency or circuit_breaker.max_requests, not both")
            return
        }
        var breaker = c.circuitBreaker ?? CircuitBreakerConfig()
        breaker.maxRequests = limit
        c.circuitBreaker = breaker
    }

    /// `protocol:` and `http2:`. HTTP/2 is the `nio` transport's: FoundationNetworking on Linux
    /// speaks HTTP/1.1 to upstreams (measured, see docs/http2.md), and `auto` chooses by
    /// ALPN, which only TLS has.
    private static func parseProtocol(_ m: ConfigMapping, into c: inout UpstreamConfig, url: URL?) {
        let requested = m.value("protocol").map { ($0, $0.choice(UpstreamProtocol.self)) }
        if case let (node, chosen?)? = requested {
            if chosen != .http1 && c.transport != .nio {
                node.error("\(chosen.rawValue) needs transport: nio (the urlsession transport speaks HTTP/1.1 to upstreams on Linux)")
            } else if chosen == .auto, let url, url.scheme?.lowercased() != "https" {
                node.error("auto chooses by TLS's ALPN and needs an https:// URL; use http2 for prior knowledge (h2c) over http://")
            } else {
                c.httpProtocol = chosen
            }
        }
        guard let node = m.value("http2"), let h2 = node.mapping() else { return }
        var config = HTTP2Config()
        h2.read("max_concurrent_streams", into: &config.maxConcurrentStreams) { $0.int(in: HTTP2Config.streamLimit) }
        h2.read("connections_per_loop", into: &config.connectionsPerLoop) { $0.int(in: HTTP2Config.connectionsLimit) }
        h2.read("ping_interval", into: &config.pingInterval) { $0.duration(positive: true) }
        h2.read("ping_timeout", into: &config.pingTimeout) { $0.duration(positive: true) }
        h2.finish()
        if (requested?.1 ?? .http1) == .http1 {
            node.error("applies to protocol: http2 or auto")
        }
        c.http2 = config
    }

    /// `url:` (one endpoint) or `endpoints: [...]`: not both, not an empty list, one scheme and
    /// one base path for all, each address once. `nil` when none is usable (reported).
    private static func parseEndpoints(_ m: ConfigMapping) -> [URL]? {
        guard let listNode = m.value("endpoints") else {
            return m.required("url")?.url(allowQuery: false).map { [$0] }
        }
        if let urlNode = m.value("url") {
            urlNode.error("give either url or endpoints, not both")
            return nil
        }
        guard let items = listNode.list() else { return nil }
        guard !items.isEmpty else {
            listNode.error("lists no endpoint (an upstream needs at least one)")
            return nil
        }
        guard items.count <= UpstreamConfig.maxEndpoints else {
            listNode.error("lists \(items.count) endpoints; at most \(UpstreamConfig.maxEndpoints) are allowed")
            return nil
        }
        var urls: [URL] = []
        var failed = false
        for item in items {
            guard let url = item.url(allowQuery: false) else {
                failed = true
                continue
            }
            if let first = urls.first {
                let target = UpstreamTarget(baseURL: url), firstTarget = UpstreamTarget(baseURL: first)
                if url.scheme?.lowercased() != first.scheme?.lowercased() {
                    item.error("mixed schemes: \(url.scheme ?? "") here, \(first.scheme ?? "") in endpoints[0]")
                    failed = true
                    continue
                }
                if target.basePath != firstTarget.basePath {
                    item.error("base path \"\(target.basePath)\" differs from endpoints[0]'s \"\(firstTarget.basePath)\"")
                    failed = true
                    continue
                }
                if urls.contains(where: { UpstreamTarget(baseURL: $0).authority == target.authority }) {
                    item.error("endpoint \(target.authority) is listed twice")
                    failed = true
                    continue
                }
            }
            urls.append(url)
        }
        return failed || urls.isEmpty ? nil : urls
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
