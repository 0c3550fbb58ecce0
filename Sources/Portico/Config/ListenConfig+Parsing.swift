import Logging

// The server-level sections: `listen`, `admin`, `logging`, `defaults`.

extension ListenConfig {
    static func parse(_ m: ConfigMapping) -> ListenConfig {
        var c = ListenConfig()
        m.read("address", into: &c.address) { $0.nonEmptyString() }
        m.read("port", into: &c.port) { $0.int(in: 0...65535) }
        m.read("threads", into: &c.threads) { $0.isWord("auto") ? ListenConfig.automaticThreads : $0.int(in: 1...1024, expected: "an integer or auto") }
        m.read("connection_limit", into: &c.connectionLimit) { $0.int(in: 1...Int.max) }
        m.read("idle_timeout", into: &c.idleTimeout) { $0.duration() }
        m.read("header_timeout", into: &c.headerTimeout) { $0.duration(positive: true) }
        m.read("request_timeout", into: &c.requestTimeout) { $0.duration(positive: true) }
        m.read("max_header_bytes", into: &c.maxHeaderBytes) { $0.size() }
        m.read("max_body_bytes", into: &c.maxBodyBytes) { $0.size(minimum: 0) }
        m.read("buffer_request_body", into: &c.bufferRequestBody) { $0.size(minimum: 0) }
        m.read("max_in_flight", into: &c.maxInFlight) { $0.int(in: 0...Int.max) }
        m.read("max_websockets", into: &c.maxWebsockets) { $0.int(in: 0...Int.max) }
        m.read("drain_delay", into: &c.drainDelay) { $0.duration() }
        m.read("shutdown_grace", into: &c.shutdownGrace) { $0.duration() }
        m.read("tls", into: &c.tls) { $0.mapping().flatMap(ListenTLSConfig.parse) }
        m.finish()
        return c
    }
}

extension AdminConfig {
    static func parse(_ m: ConfigMapping) -> AdminConfig {
        var c = AdminConfig()
        m.read("enabled", into: &c.enabled) { $0.bool() }
        m.read("address", into: &c.address) { $0.nonEmptyString() }
        m.read("port", into: &c.port) { $0.int(in: 0...65535) }
        m.read("token", into: &c.token) { $0.nonEmptyString() }
        m.read("public_metrics", into: &c.publicMetrics) { $0.bool() }
        m.finish()
        AdminAccess.checkExposure(c, section: m)
        return c
    }
}

extension LoggingConfig {
    static func parse(_ m: ConfigMapping) -> LoggingConfig {
        var c = LoggingConfig()
        m.read("level", into: &c.level) { $0.choice(Logger.Level.self) }
        m.read("format", into: &c.format) { $0.choice(Format.self) }
        m.finish()
        return c
    }
}

extension DefaultsConfig {
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> DefaultsConfig {
        var c = DefaultsConfig()
        m.read("middleware", into: &c.middleware) { $0.middlewareList(names: names) }
        m.finish()
        return c
    }
}

extension ConfigNode {
    /// `[log, auth]`: each name must be defined, and none may appear twice.
    func middlewareList(names: ConfigNames) -> [String]? {
        guard let items = list() else { return nil }
        var result: [String] = []
        for item in items {
            guard let name = item.reference(to: "middleware", among: names.middleware) else { continue }
            if result.contains(name) {
                item.error("duplicate middleware \(name.quotedForMessage) in this list")
                continue
            }
            result.append(name)
        }
        return result
    }
}
