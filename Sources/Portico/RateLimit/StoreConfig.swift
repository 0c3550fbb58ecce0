import RedisClient

/// `stores.NAME` — a place outside the process where `rate_limit` middleware keep their
/// buckets, so every replica draws from the same ones. `type: redis` is the one type.
public struct StoreConfig: Sendable, Equatable {
    /// Where the server is, with the user and password (from the URL or `password:`).
    public var host: String
    public var port: Int = 6379
    public var database: Int = 0
    public var username: String?
    /// Never shown in messages or logs.
    public var password: String?
    /// `rediss://`: TLS with `tls`.
    public var useTLS: Bool = false
    /// `stores.NAME.tls` (CA, client certificate, server name, minimum version).
    public var tls = TLSClientConfig()
    /// Connections to the server; commands are pipelined on them.
    public var pool: Int = 8
    /// The most a request waits for the store (connecting included) before `on_store_error` applies.
    public var timeout: Duration = .milliseconds(25)
    /// Bound on opening one connection (TCP, TLS, authentication), apart from requests.
    public var connectTimeout: Duration = .seconds(2)
    /// Put before every key, so several applications can share one Redis database.
    public var keyPrefix: String = "portico:"

    public init(host: String, port: Int = 6379) {
        self.host = host
        self.port = port
    }

    /// `redis://host:port/db` or `rediss://…`, for messages: never the password.
    public var shownURL: String { redisConfiguration.description }

    /// The client's view of these settings.
    public var redisConfiguration: RedisConfiguration {
        var c = RedisConfiguration(host: host, port: port)
        c.database = database
        c.username = username
        c.password = password
        if useTLS {
            c.tls = tls.nioConfiguration
            c.tlsServerName = tls.serverName
        }
        c.connections = pool
        c.commandTimeout = .nanoseconds(GatewayMetrics.nanoseconds(timeout))
        c.connectTimeout = .nanoseconds(GatewayMetrics.nanoseconds(connectTimeout))
        c.clientName = "portico"
        return c
    }
}

extension StoreConfig {
    static let supportedTypes = ["redis"]

    /// `stores.NAME`: `type`, `url` required; `password`, `tls`, `pool`, `timeout`,
    /// `connect_timeout`, `key_prefix`.
    static func parse(_ m: ConfigMapping) -> StoreConfig? {
        guard m.required("type")?.choice(supportedTypes) != nil else {
            return nil  // keys depend on the type: checking them would only add noise
        }
        var parsed: RedisConfiguration?
        if let urlNode = m.required("url"), let value = urlNode.scalar(expected: "a redis:// or rediss:// URL") {
            do throws(RedisConfiguration.URLError) {
                parsed = try RedisConfiguration(url: value.text)
            } catch {
                // The URL may hold a password: the message names the problem, never the value.
                urlNode.error("invalid Redis URL (\(error.description)); expected redis://[user:password@]host[:port][/db] or rediss://…")
            }
        }
        var c = StoreConfig(host: parsed?.host ?? "", port: parsed?.port ?? 6379)
        c.database = parsed?.database ?? 0
        c.username = parsed?.username
        c.password = parsed?.password
        c.useTLS = parsed?.tls != nil
        m.read("password", into: &c.password) { $0.string() }
        m.read("pool", into: &c.pool) { $0.int(in: 1...1024) }
        m.read("timeout", into: &c.timeout) { $0.duration(positive: true) }
        m.read("connect_timeout", into: &c.connectTimeout) { $0.duration(positive: true) }
        m.read("key_prefix", into: &c.keyPrefix) { $0.string() }
        if let tlsNode = m.value("tls"), let section = tlsNode.mapping() {
            c.tls = TLSClientConfig.parse(section, transport: .nio, pinning: false)
            if parsed != nil, !c.useTLS {
                tlsNode.error("applies to rediss:// URLs only")
            }
        }
        m.finish()
        return parsed == nil ? nil : c
    }
}
