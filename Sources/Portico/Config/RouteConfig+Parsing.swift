extension RouteConfig {
    /// `routes:` — each route, plus the checks that span routes (unique names).
    static func parseList(_ node: ConfigNode, names: ConfigNames) -> [RouteConfig] {
        guard let items = node.list() else { return [] }
        var routes: [RouteConfig] = []
        var firstLine: [String: Int?] = [:]
        for item in items {
            guard let m = item.mapping() else { continue }
            let nameNode = m.value("name")
            // Names count even for broken routes, so a duplicate is still reported.
            let (name, route) = parse(m, names: names)
            guard let name else { continue }
            if let line = firstLine[name] {
                let shown = nameNode?.scalar()?.shown ?? name.quotedForMessage
                nameNode?.error("duplicate route name \(shown)"
                    + (line.map { " (first defined at line \($0))" } ?? ""))
                continue
            }
            firstLine[name] = nameNode?.line
            if let route { routes.append(route) }
        }
        return routes
    }

    /// One `routes[]` entry: its name when readable, and the route unless it had errors.
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> (name: String?, route: RouteConfig?) {
        let name = m.required("name")?.nonEmptyString()
        let matchMapping = m.required("match")?.mapping()
        let match = matchMapping.flatMap(Match.parse)
        let upstreamNode = m.value("upstream"), directNode = m.value("direct")
        let upstream = upstreamNode?.reference(to: "upstream", among: names.upstreams)
        let direct = directNode?.mapping().flatMap(Direct.parse)
        switch (upstreamNode, directNode) {
        case (.some, .some): m.error("set either upstream or direct, not both")
        case (nil, nil): m.error("needs either upstream or direct")
        default: break
        }
        var stripPrefix = false
        if let node = m.value("strip_prefix"), let value = node.bool() {
            stripPrefix = value
            if value, let matchMapping, matchMapping.value("path_prefix") == nil {
                node.error("requires match.path_prefix")
            }
        }
        var middleware: [String]?
        m.read("middleware", into: &middleware) { $0.middlewareList(names: names) }
        var timeout: Duration?
        m.read("timeout", into: &timeout) { $0.duration(positive: true) }
        var maxInFlight: Int?
        m.read("max_in_flight", into: &maxInFlight) { $0.int(in: 1...Int.max) }
        var streamIdleTimeout: Duration = .seconds(60)
        m.read("stream_idle_timeout", into: &streamIdleTimeout) { $0.duration(positive: true) }
        var maxStreamDuration: Duration?
        m.read("max_stream_duration", into: &maxStreamDuration) { $0.duration(positive: true) }
        let upgrade = RouteConfig.parseUpgrade(m, upstream: upstream, direct: directNode != nil, middleware: middleware,
                                               names: names)
        var websocketIdleTimeout: Duration = .seconds(3600)
        m.read("websocket_idle_timeout", into: &websocketIdleTimeout) { $0.duration(positive: true) }
        m.finish()

        guard let name, let match, upstream != nil || direct != nil else { return (name, nil) }
        return (name, RouteConfig(name: name, match: match, upstream: upstream, direct: direct,
                                  stripPrefix: stripPrefix, middleware: middleware, timeout: timeout,
                                  maxInFlight: maxInFlight, streamIdleTimeout: streamIdleTimeout,
                                  maxStreamDuration: maxStreamDuration, upgrade: upgrade,
                                  websocketIdleTimeout: websocketIdleTimeout))
    }
}

extension RouteConfig.Match {
    /// `match:` — at least one of `path`, `path_prefix`, `host`; `methods` narrows further.
    static func parse(_ m: ConfigMapping) -> RouteConfig.Match? {
        var c = RouteConfig.Match()
        m.read("path", into: &c.path) { $0.absolutePath() }
        m.read("path_prefix", into: &c.pathPrefix) { $0.absolutePath() }
        m.read("host", into: &c.host) { $0.hostPattern() }
        m.read("methods", into: &c.methods) { $0.methodList() }
        m.finish()
        let present = ["path", "path_prefix", "host"].filter { m.value($0) != nil }
        if present.isEmpty {
            m.error("needs at least one of path, path_prefix, host")
            return nil
        }
        if present.contains("path"), present.contains("path_prefix") {
            m.error("path and path_prefix cannot both be set (path is an exact match)")
            return nil
        }
        return c
    }
}

extension RouteConfig.Direct {
    /// `direct:` — a canned response.
    static func parse(_ m: ConfigMapping) -> RouteConfig.Direct? {
        var c = RouteConfig.Direct()
        m.read("status", into: &c.status) { $0.int(in: 100...599) }
        let bodyNode = m.value("body")
        if let body = bodyNode?.string() { c.body = body }
        if !c.body.isEmpty, !HTTPSyntax.responseHasBody(status: c.status) {
            bodyNode?.error("must be empty for status \(c.status)")
        }
        m.read("headers", into: &c.headers) { $0.headerFields(framingSetBy: "Portico") }
        m.finish()
        return c
    }
}

extension ConfigNode {
    /// A request path: must start with `/`.
    func absolutePath() -> String? {
        guard let value = scalar() else { return nil }
        guard value.text.hasPrefix("/") else {
            error("must start with \"/\", got \(value.shown)")
            return nil
        }
        guard !value.text.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7F }) else {
            error("must not contain spaces or control characters")
            return nil
        }
        return value.text
    }

    /// `api.example.com` or `*.example.com`, lower-cased; no port.
    func hostPattern() -> String? {
        guard let value = scalar() else { return nil }
        let host = value.text.lowercased()
        let labels = (host.hasPrefix("*.") ? String(host.dropFirst(2)) : host).split(separator: ".", omittingEmptySubsequences: false)
        let valid = !labels.isEmpty && labels.allSatisfy { label in
            !label.isEmpty && !label.hasPrefix("-") && !label.hasSuffix("-")
                && label.unicodeScalars.allSatisfy { $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "-") }
        }
        guard valid else {
            error("invalid host \(value.shown) (expected e.g. api.example.com or *.example.com, without port)")
            return nil
        }
        return host
    }

    /// HTTP methods, upper-cased, each a valid token and listed once.
    func methodList() -> [String]? {
        guard let items = list() else { return nil }
        var result: [String] = []
        for item in items {
            guard let value = item.scalar() else { continue }
            guard HTTPSyntax.isToken(value.text) else {
                item.error("invalid HTTP method \(value.shown)")
                continue
            }
            let method = value.text.uppercased()
            if result.contains(method) {
                item.error("duplicate method \(method.quotedForMessage)")
                continue
            }
            result.append(method)
        }
        return result
    }
}

extension RouteConfig {
    /// The middleware types a WebSocket handshake cannot go through: a cached, compressed or
    /// retried handshake makes no sense (a cache could even answer it), so `check` refuses them
    /// on an upgrade route rather than skipping them silently.
    static let upgradeRefusedMiddleware: Set<String> = ["cache", "compress", "retry"]

    /// `websocket: true` (the short form of `upgrade: [websocket]`) or `upgrade: [TOKEN, …]`: the
    /// protocols a client may upgrade to on this route. Only a proxy route on a `nio` upstream
    /// can carry one (`urlsession` cannot relay an upgraded connection; see README "WebSocket"),
    /// and its chain must hold no `cache`, `compress` or `retry`.
    static func parseUpgrade(_ m: ConfigMapping, upstream: String?, direct: Bool, middleware: [String]?,
                             names: ConfigNames) -> [String] {
        var protocols: [String] = []
        var websocket: Bool?
        m.read("websocket", into: &websocket) { $0.bool() }
        if websocket == true { protocols = ["websocket"] }
        var listed: [String]?
        m.read("upgrade", into: &listed) { node in
            guard let items = node.list() else { return nil }
            var tokens: [String] = []
            for item in items {
                guard let value = item.scalar() else { continue }
                let token = value.text.lowercased()
                guard HTTPSyntax.isToken(token) else {
                    item.error("invalid upgrade protocol \(value.shown) (expected a token such as websocket)")
                    continue
                }
                if !tokens.contains(token) { tokens.append(token) }
            }
            return tokens
        }
        if let listed {
            if websocket == false, listed.contains("websocket") {
                m.value("websocket")?.error("is false but upgrade lists websocket")
            }
            for token in listed where !protocols.contains(token) { protocols.append(token) }
        }
        guard !protocols.isEmpty else { return [] }
        let node = m.value("upgrade") ?? m.value("websocket")
        if direct {
            node?.error("an upgrade needs an upstream: a direct route cannot switch protocols")
            return protocols
        }
        if let upstream, names.upstreamTransports[upstream] == .urlsession {
            node?.error("upstream \(upstream.quotedForMessage) uses transport: urlsession, which cannot relay an upgraded "
                        + "connection on Linux (FoundationNetworking's URLSessionWebSocketTask re-frames messages and "
                        + "hides ping/pong); set transport: nio on that upstream")
        }
        let chain = middleware ?? names.defaultMiddleware
        let refused = chain.filter { names.middlewareTypes[$0].map(upgradeRefusedMiddleware.contains) ?? false }
        if !refused.isEmpty {
            let which = refused.map { "\($0.quotedForMessage) (\(names.middlewareTypes[$0] ?? ""))" }.joined(separator: ", ")
            node?.error("cache, compress and retry do not apply to an upgrade, and this route's middleware has "
                        + "\(which)\(middleware == nil ? " from defaults.middleware" : ""): give the route a middleware "
                        + "list without them")
        }
        return protocols
    }
}
