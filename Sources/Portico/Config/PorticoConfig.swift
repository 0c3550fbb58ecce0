import NIOCore
import Foundation
import Logging

/// A parsed, validated configuration: an immutable value. Runtime objects (router, upstream
/// clients, token managers) are built from it; a reload builds new ones from a new value.
public struct PorticoConfig: Sendable, Equatable {
    /// The file it was read from (for messages); "<embedded>" for built-in configs.
    public var source: String
    public var listen: ListenConfig
    public var admin: AdminConfig
    public var logging: LoggingConfig
    public var upstreams: [String: UpstreamConfig]
    public var credentials: [String: CredentialConfig]
    public var middleware: [String: MiddlewareConfig]
    public var defaults: DefaultsConfig
    public var routes: [RouteConfig]
    /// `tracing:`; `nil` (the default): no spans, nothing exported.
    public var tracing: TracingConfig?
    /// `stores.NAME`: shared places for rate-limit buckets (Redis), named by `rate_limit.store`.
    public var stores: [String: StoreConfig] = [:]
    /// Accepted settings worth a warning whenever a runtime is built from them (start, reload,
    /// `portico check`), such as `insecure_skip_verify: true`.
    public var warnings: [ConfigDiagnostic] = []

    public init(source: String = "<embedded>", listen: ListenConfig = ListenConfig(), admin: AdminConfig = AdminConfig(),
                logging: LoggingConfig = LoggingConfig(), upstreams: [String: UpstreamConfig] = [:],
                credentials: [String: CredentialConfig] = [:], middleware: [String: MiddlewareConfig] = [:],
                defaults: DefaultsConfig = DefaultsConfig(), routes: [RouteConfig] = []) {
        self.source = source
        self.listen = listen
        self.admin = admin
        self.logging = logging
        self.upstreams = upstreams
        self.credentials = credentials
        self.middleware = middleware
        self.defaults = defaults
        self.routes = routes
    }

    /// What the configuration holds, as `portico check` reports it: `1 route, 2 upstreams, …`.
    public var summary: String {
        func counted(_ count: Int, _ singular: String, _ plural: String) -> String {
            "\(count) \(count == 1 ? singular : plural)"
        }
        return [counted(routes.count, "route", "routes"), counted(upstreams.count, "upstream", "upstreams"),
                counted(middleware.count, "middleware", "middleware"),
                counted(credentials.count, "credential", "credentials")].joined(separator: ", ")
    }
}

/// `listen:` — the proxy listener.
public struct ListenConfig: Sendable, Equatable {
    /// One libmicrohttpd thread (and its paired event loop) per core the process may use: its
    /// affinity mask, its cgroup's cpuset and CPU quota (`CPUBudget`).
    public static let automaticThreads = CPUBudget.current().cores

    public var address: String = "0.0.0.0"
    public var port: Int = 8080
    /// libmicrohttpd daemons, one thread each. Default (`auto`): one per core.
    public var threads: Int = ListenConfig.automaticThreads
    /// Client connections open at once. `nil` (not set): as many as the descriptor limit allows,
    /// up to 10 000 (`ConnectionLimitSizing`).
    public var connectionLimit: Int?
    /// Idle connections are closed after this long.
    public var idleTimeout: Duration = .seconds(60)
    /// A request head must be complete within this (slow clients are disconnected).
    public var headerTimeout: Duration = .seconds(10)
    /// Every request must be answered within this (head, body, chain, upstream).
    public var requestTimeout: Duration = .seconds(30)
    public var maxHeaderBytes: Int = 32 * 1024
    public var maxBodyBytes: Int = 10 * 1024 * 1024
    /// A request body that declares a length up to this is read whole before the chain runs
    /// (replayable: retries, 401 replays); a larger or chunked one streams to the upstream.
    public var bufferRequestBody: Int = Body.bufferedLimit
    /// Requests in flight at once over all routes; past it, 503 `overloaded` at once. 0: no cap
    /// (connections are still capped by `connectionLimit`).
    public var maxInFlight: Int = 4096
    /// Upgraded (WebSocket) sessions open at once on this listener; past it a handshake is
    /// answered 503 `overloaded`. 0: no cap but `connectionLimit` (sessions count toward it).
    public var maxWebsockets: Int = 0
    /// On SIGTERM: keep accepting this long after /readyz turns 503 (load balancers notice).
    public var drainDelay: Duration = .zero
    /// On SIGTERM: in-flight requests get this long to finish.
    public var shutdownGrace: Duration = .seconds(30)
    /// `listen.tls`: terminate TLS on the proxy listener; `nil`: plain HTTP.
    public var tls: ListenTLSConfig?

    public init() {}
}

/// `admin:` — /metrics, /healthz, /readyz, the dashboard and its JSON. Disabled with `admin: { enabled: false }`.
public struct AdminConfig: Sendable, Equatable {
    public var enabled: Bool = true
    public var address: String = "127.0.0.1"
    public var port: Int = 9901
    /// `admin.token`: the bearer every endpoint but the probes then requires (`AdminAccess`);
    /// required for an address other than loopback.
    public var token: String?
    /// `admin.public_metrics`: serve `/metrics` without the token (a scraper without credentials).
    public var publicMetrics: Bool = false

    public init() {}
}

/// `logging:`
public struct LoggingConfig: Sendable, Equatable {
    public enum Format: String, Sendable, Equatable, CaseIterable {
        case json, logfmt
    }
    public var level: Logger.Level = .info
    public var format: Format = .json

    public init() {}
}

/// `defaults:`
public struct DefaultsConfig: Sendable, Equatable {
    /// Middleware names, outermost first, for routes that do not list their own.
    public var middleware: [String] = []

    public init() {}
}

/// `routes[]`
public struct RouteConfig: Sendable, Equatable {
    public struct Match: Sendable, Equatable {
        /// Exact path.
        public var path: String?
        /// Path prefix; the longest matching prefix wins.
        public var pathPrefix: String?
        /// Host (without port), case-insensitive. `*.example.com` matches one or more labels.
        public var host: String?
        /// Allowed methods; empty means all.
        public var methods: [String] = []

        public init(path: String? = nil, pathPrefix: String? = nil, host: String? = nil, methods: [String] = []) {
            self.path = path
            self.pathPrefix = pathPrefix
            self.host = host
            self.methods = methods
        }
    }

    /// `direct:` — answer without an upstream.
    public struct Direct: Sendable, Equatable {
        public var status: Int = 200
        public var body: String = ""
        /// In order, as written.
        public var headers: [(String, String)] = []

        public init(status: Int = 200, body: String = "", headers: [(String, String)] = []) {
            self.status = status
            self.body = body
            self.headers = headers
        }

        public static func == (a: Direct, b: Direct) -> Bool {
            a.status == b.status && a.body == b.body && a.headers.elementsEqual(b.headers, by: { $0 == $1 })
        }
    }

    public var name: String
    public var match: Match
    /// Exactly one of `upstream` and `direct` is set.
    public var upstream: String?
    public var direct: Direct?
    public var stripPrefix: Bool = false
    /// `nil`: take `defaults.middleware`; `[]`: none.
    public var middleware: [String]?
    /// Overrides `listen.request_timeout` for this route.
    public var timeout: Duration?
    /// Requests in flight on this route at once; past it, 503 `overloaded`. `nil`: no route cap.
    public var maxInFlight: Int?
    /// The longest silence between two chunks of a streamed body.
    public var streamIdleTimeout: Duration = .seconds(60)
    /// The longest a streamed response may last; `nil`: no limit.
    public var maxStreamDuration: Duration?
    /// Protocols a client may upgrade to (`websocket: true` is `["websocket"]`); empty: none,
    /// and `Upgrade` is dropped as any hop-by-hop field.
    public var upgrade: [String] = []
    /// An upgraded session with no byte either way for this long is closed (`websocket_idle_timeout`).
    public var websocketIdleTimeout: Duration = .seconds(3600)

    public init(name: String, match: Match, upstream: String? = nil, direct: Direct? = nil,
                stripPrefix: Bool = false, middleware: [String]? = nil, timeout: Duration? = nil,
                maxInFlight: Int? = nil, streamIdleTimeout: Duration = .seconds(60), maxStreamDuration: Duration? = nil,
                upgrade: [String] = [], websocketIdleTimeout: Duration = .seconds(3600)) {
        self.upgrade = upgrade
        self.websocketIdleTimeout = websocketIdleTimeout
        self.streamIdleTimeout = streamIdleTimeout
        self.maxStreamDuration = maxStreamDuration
        self.name = name
        self.match = match
        self.upstream = upstream
        self.direct = direct
        self.stripPrefix = stripPrefix
        self.middleware = middleware
        self.timeout = timeout
        self.maxInFlight = maxInFlight
    }
}

/// `credentials.NAME`
public struct CredentialConfig: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        /// A fixed header value (from `${VAR}` or `${file:…}`).
        case staticHeader(header: String, value: String)
        case basic(username: String, password: String)
        case oauth2ClientCredentials(OAuth2Config)
        case oauth2RefreshToken(OAuth2Config, refreshToken: String)
    }

    public var kind: Kind
    /// Refresh this long before the token expires.
    public var refreshBeforeExpiry: Duration = .seconds(30)
    /// Lifetime assumed when the token response carries no `expires_in`.
    public var defaultLifetime: Duration = .seconds(300)
    /// Timeout of one call to the token endpoint.
    public var timeout: Duration = .seconds(10)
    /// Backoff between failed token refreshes while the IdP is down: the nth failure waits a
    /// random part (full jitter) of `min(backoffCap, backoffBase·2ⁿ⁻¹)`.
    public var backoffBase: Duration = .milliseconds(500)
    public var backoffCap: Duration = .seconds(30)
    /// `stores.NAME` where every replica shares the token (OAuth2 kinds); `nil`: this process only.
    public var store: String?
    /// Seals the shared token (required with `store`).
    public var encryptionKeys: TokenEncryptionKeys?

    public init(kind: Kind) {
        self.kind = kind
    }

    public var typeName: String {
        switch kind {
        case .staticHeader: "static"
        case .basic: "basic"
        case .oauth2ClientCredentials: "oauth2_client_credentials"
        case .oauth2RefreshToken: "oauth2_refresh_token"
        }
    }
}

/// The OAuth2 parts shared by both grant types.
public struct OAuth2Config: Sendable, Equatable {
    public enum ClientAuthMethod: String, Sendable, Equatable, CaseIterable {
        case clientSecretBasic = "client_secret_basic"
        case clientSecretPost = "client_secret_post"
    }
    public var tokenURL: URL
    public var clientID: String
    public var clientSecret: String
    public var clientAuth: ClientAuthMethod = .clientSecretBasic
    public var scope: String?
    public var audience: String?
    /// Extra form parameters, in order.
    public var extraParams: [String: String] = [:]
    /// How token calls travel: URLSession by default; `nio` for what URLSession cannot do on Linux.
    public var transport: UpstreamConfig.Transport = .urlsession
    /// `credentials.NAME.tls`, for an `https://` token URL.
    public var tls = TLSClientConfig()

    public init(tokenURL: URL, clientID: String, clientSecret: String) {
        self.tokenURL = tokenURL
        self.clientID = clientID
        self.clientSecret = clientSecret
    }
}
