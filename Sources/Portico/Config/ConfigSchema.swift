import Logging

/// The configuration file's shape, declared once: `portico schema` renders it as a JSON Schema
/// (`ConfigSchema+JSON.swift`) for editors and validators, and `ConfigSchemaDriftTests` checks
/// it against the loader: the keys each parser asks `ConfigMapping` for, section by section, and
/// which sections refuse unknown keys. A key added to a parser without a line here (or the
/// reverse) fails that test, which names the key and the path.
///
/// Adding a key is one line in its section: `.key("name", .duration(), "what it does; default")`.
/// Descriptions are the reference file's comments (`config/portico.yaml`), shortened.
/// Choices come from the enums the parsers read (`Transport.allCases`, …), so they cannot drift.
public enum ConfigSchema {
    /// One value's kind, as the parsers read it (`ConfigNode`'s typed readers).
    indirect enum Value: Sendable {
        /// Free text: any scalar is read as its text (`client_id: 1234` is the string "1234").
        case text
        /// Free text that must not be empty (names, secrets, file paths).
        case nonEmptyText
        /// A string matching an ECMA-262 pattern; `note` says in words what it must be.
        case pattern(String, note: String)
        case integer(ClosedRange<Int>)
        case boolean
        /// `250ms`, `10s`, `5m`, `1h`, `1.5s` or `0`; `positive` refuses zero.
        case duration(positive: Bool = false)
        /// `512B`, `64KiB`, `10MB` or a byte count, at least `minimum`.
        case size(minimum: Int = 1)
        /// `100/s`, `6000/m`, `5/10s`.
        case rate
        /// `20%`.
        case percentage
        /// A number from 0 to 1, or a percentage.
        case ratio
        /// One of these words.
        case choice([String])
        /// An absolute http(s) URL.
        case url
        /// A name defined under another section (`upstreams`, `credentials`, …).
        case reference(section: String)
        /// Any of these (a rate-limit key is a word or a list of words).
        case either([Value])
        case list(Value, unique: Bool = false, nonEmpty: Bool = false)
        /// A mapping whose keys are names (`upstreams.NAME`) or header fields: any key, each
        /// value the same kind; `keys` constrains the key's spelling.
        case map(Value, keys: Value? = nil)
        /// A mapping with fixed keys; unknown keys are refused.
        case section(Section)
        /// A mapping whose keys depend on its `type:` word (`credentials.NAME`, `middleware.NAME`).
        case typed([(type: String, section: Section)])
    }

    struct Key: Sendable {
        var name: String
        var value: Value
        var required: Bool
        var description: String
    }

    /// A constraint across keys of one section, beyond each key's own.
    enum Rule: Sendable {
        /// Exactly one of these keys (`routes[].upstream` or `direct`).
        case exactlyOne([String])
        /// At least one of these keys (`match` needs path, path_prefix or host).
        case atLeastOne([String])
        /// Not all of these keys together (`match.path` is exact: no `path_prefix` beside it).
        case notTogether([String])
    }

    struct Section: Sendable {
        var description: String
        var keys: [Key]
        var rules: [Rule] = []

        init(_ description: String, rules: [Rule] = [], _ keys: [Key]) {
            self.description = description
            self.keys = keys
            self.rules = rules
        }
    }

    /// An optional key.
    static func key(_ name: String, _ value: Value, _ description: String) -> Key {
        Key(name: name, value: value, required: false, description: description)
    }

    /// A key the loader reports as missing when absent.
    static func required(_ name: String, _ value: Value, _ description: String) -> Key {
        Key(name: name, value: value, required: true, description: description)
    }

    static func words<E: RawRepresentable & CaseIterable>(_: E.Type) -> Value where E.RawValue == String {
        .choice(E.allCases.map(\.rawValue))
    }

    // MARK: The file

    static let root = Section("A Portico configuration file (portico run --config FILE).", [
        key("listen", .section(listen), "The proxy listener."),
        key("admin", .section(admin), "The admin listener: /metrics, /healthz, /readyz, POST /-/reload, the dashboard. Keep it off the public interface."),
        key("logging", .section(logging), "Log level and format."),
        key("tracing", .section(tracing), "OpenTelemetry traces over OTLP/HTTP; off when absent."),
        key("upstreams", .map(.section(upstream)), "Upstream services, by name; routes refer to them with upstream: NAME."),
        key("credentials", .map(.typed(credentialTypes)), "Credentials, by name; the auth middleware injects them. Secrets belong in ${VAR} or ${file:...}."),
        key("stores", .map(.typed(storeTypes)), "Shared places for rate-limit buckets and quota counts, by name (rate_limit.store, quota.store)."),
        key("middleware", .map(.typed(middlewareTypes)), "Named, reusable middleware instances; routes list them by name."),
        key("defaults", .section(defaults), "Settings for routes that do not set their own."),
        required("routes", .list(.section(route), nonEmpty: true), "Routes, matched by host, then exact path, then the longest path prefix. At least one."),
    ])

    static let listen = Section("The proxy listener.", [
        key("address", .nonEmptyText, "Address to listen on; default 0.0.0.0."),
        key("port", .integer(0...65535), "Port; default 8080; 0 picks a free port."),
        key("threads", .either([.integer(1...1024), .choice(["auto"])]), "libmicrohttpd threads (each paired with an event loop), or auto: one per core (the default)."),
        key("connection_limit", .integer(1...Int.max), "Client connections open at once; default: as many as the descriptor limit allows, up to 10000."),
        key("idle_timeout", .duration(), "Close idle keep-alive connections after this; default 60s."),
        key("header_timeout", .duration(positive: true), "A request head must be complete this long after accept; default 10s."),
        key("request_timeout", .duration(positive: true), "Until the response head: head, body, chain, upstream; default 30s."),
        key("max_header_bytes", .size(), "Request head limit (431 beyond); default 32KiB."),
        key("max_body_bytes", .size(minimum: 0), "Request body limit (413 beyond); default 10MiB."),
        key("buffer_request_body", .size(minimum: 0), "A declared body up to this is read whole first (replayable by retry and auth); default 64KiB."),
        key("max_in_flight", .integer(0...Int.max), "Requests in flight over all routes; beyond, 503 overloaded; 0 = no cap; default 4096."),
        key("max_websockets", .integer(0...Int.max), "Upgraded (WebSocket) sessions open at once; beyond, 503 overloaded; 0 (default) = as many as the descriptor limit holds (4 descriptors a session, 7 on a TLS listener)."),
        key("drain_delay", .duration(), "On SIGTERM keep accepting this long after /readyz turns 503; default 0."),
        key("shutdown_grace", .duration(), "On SIGTERM in-flight requests get this long; default 30s."),
        key("tls", .section(listenTLS), "Serve HTTPS; default plain HTTP."),
    ])

    static let listenTLS = Section("TLS on the proxy listener (TLS 1.2 and 1.3).", [
        required("cert_file", .nonEmptyText, "PEM certificate chain, leaf first."),
        required("key_file", .nonEmptyText, "Unencrypted PEM private key matching cert_file."),
    ])

    static let admin = Section("The admin listener.", [
        key("enabled", .boolean, "Default true."),
        key("address", .nonEmptyText, "Default 127.0.0.1; any non-loopback address requires token."),
        key("port", .integer(0...65535), "Default 9901; must differ from listen.port."),
        key("token", .nonEmptyText, "Bearer token every admin endpoint but /healthz, /readyz and / requires; from ${VAR} or ${file:...}."),
        key("public_metrics", .boolean, "Serve /metrics without the token; default false."),
    ])

    static let logging = Section("Logging.", [
        key("level", .choice(Logger.Level.allCases.map(\.rawValue)), "Default info."),
        key("format", words(LoggingConfig.Format.self), "Default json."),
    ])

    static let tracing = Section("OpenTelemetry tracing.", [
        required("endpoint", .url, "The collector; /v1/traces is added to a URL without a path."),
        key("protocol", words(TracingConfig.WireProtocol.self), "Default http/protobuf; gRPC is not built in."),
        key("sample_ratio", .ratio, "0..1 (or 25%) of new traces kept; a caller's decision is followed."),
        key("service_name", .nonEmptyText, "The service.name resource attribute; default portico."),
        key("headers", .map(.headerValue, keys: .headerName), "Sent with every export; values never logged."),
        key("timeout", .duration(positive: true), "One export call; default 10s."),
        key("max_queue_size", .integer(1...1_000_000), "Finished spans waiting for export; beyond, dropped; default 2048."),
        key("schedule_delay", .duration(positive: true), "A finished span waits at most this long for its batch; default 5s."),
    ])

    static let upstream = Section("An upstream service.", rules: [.exactlyOne(["url", "endpoints"])], [
        key("url", .url, "http or https, a host, an optional base path; no query or fragment (or endpoints:, not both)."),
        key("endpoints", .list(.url, unique: true, nonEmpty: true), "Several addresses of one service: one scheme and base path for all, at most 64."),
        key("balance", words(BalanceStrategy.self), BalancingPolicies.schemaDescription),
        key("dns_refresh", .duration(positive: true), "url: with a host name: every address it resolves to is an endpoint, re-resolved this often (https needs nio)."),
        key("health_check", .section(healthCheck), "Active checks per endpoint, off the request path; default none."),
        key("outlier_detection", .section(outlierDetection), "Passive ejection of failing endpoints; defaults apply when absent."),
        key("circuit_breaker", .section(circuitBreaker), "Immediate 503 upstream_overloaded past these; default none."),
        key("concurrency", .either([.choice(["adaptive"]), .integer(1...1_000_000)]),
            "Requests in flight at once: a number (circuit_breaker.max_requests) or adaptive (a limit that follows latency); default none."),
        key("adaptive_concurrency", .section(adaptiveConcurrency), "With concurrency: adaptive: the limit's bounds, window and target; defaults apply when absent."),
        key("transport", words(UpstreamConfig.Transport.self), "urlsession (default; Foundation) or nio (Portico's pool on SwiftNIO)."),
        key("protocol", words(UpstreamProtocol.self), "http1 (default) | http2 (h2c prior knowledge on http://, ALPN h2 on https://) | auto (https: ALPN h2, else HTTP/1.1); http2 and auto need transport: nio."),
        key("http2", .section(http2), "HTTP/2 connections (protocol: http2 or auto)."),
        key("connect_timeout", .duration(positive: true), "Default 2s."),
        key("timeout", .duration(positive: true), "One exchange with the upstream; default 15s."),
        key("max_connections", .integer(1...Int.max), "Connection pool size; default 64."),
        key("idle_timeout", .duration(positive: true), "nio only: a pooled connection idle this long is closed; default 4s."),
        key("preserve_host", .boolean, "Send the client's Host instead of the upstream's; default false."),
        key("host_header", .pattern("^(\\[[0-9A-Fa-f:.]+\\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?$", note: "host[:port]"),
            "Send this Host instead of the URL's authority (after header hygiene); not with preserve_host."),
        key("max_response_bytes", .size(), "Larger bodies become 502 upstream_response_too_large; default none on nio, 64MiB on urlsession."),
        key("tls", .section(clientTLS), "TLS to an https:// upstream (nio for any key)."),
        key("provider_limits", .section(providerLimits), "Learn the provider's limits from its RateLimit / X-RateLimit-* / Retry-After headers and hold back what it would refuse; default off."),
    ])

    static let http2 = Section("Multiplexed HTTP/2 connections per endpoint and event loop.", [
        key("max_concurrent_streams", .integer(HTTP2Config.streamLimit), "Streams per connection at most (and at most the peer's SETTINGS_MAX_CONCURRENT_STREAMS); default 100."),
        key("connections_per_loop", .integer(HTTP2Config.connectionsLimit), "Connections each event loop opens per endpoint when the others are full (within max_connections); default 1."),
        key("ping_interval", .duration(positive: true), "A PING after this long without a frame from the upstream; default 30s."),
        key("ping_timeout", .duration(positive: true), "An unanswered PING closes the connection after this; default 5s."),
    ])

    static let providerLimits = Section("A learned budget per scope, spent before each attempt and corrected by every response.", [
        key("scope", .either([.choice(["upstream", "route"]), .pattern("^header:[!#$%&'*+.^_`|~0-9A-Za-z-]+$", note: "header:NAME")]),
            "upstream (default), route, or header:NAME (one budget per value, e.g. the API key the provider counts by)."),
        key("when_exhausted", words(ProviderLimitsConfig.WhenExhausted.self), "Budget spent or provider pausing: wait (default; when the wait fits max_wait) or reject (429 provider_exhausted at once)."),
        key("max_wait", .duration(positive: true), "The longest a request waits for the provider's reset (never past its deadline); default 5s."),
        key("max_scopes", .integer(1...10_000_000), "Scopes kept in memory at most; default 10000."),
        key("default_hold", .duration(positive: true), "How long a 429 that says nothing of when to come back holds the scope; default 1s."),
        key("store", .reference(section: "stores"), "A name under stores: to share what is learned with every replica (one replica's 429 pauses all); default this process only."),
    ])

    static let healthCheck = Section("GET path on each endpoint every interval.", [
        required("path", .absolutePath, "The path probed, e.g. /healthz."),
        key("interval", .duration(positive: true), "Default 5s."),
        key("timeout", .duration(positive: true), "One probe; not above interval; default 1s."),
        key("healthy", .integer(1...100), "Passes in a row that mark an endpoint healthy; default 2."),
        key("unhealthy", .integer(1...100), "Failures in a row that mark it unhealthy; default 3."),
        key("expect", .either([.integer(100...599), .pattern("^[1-5][0-9]{2}(-[1-5][0-9]{2})?$", note: "a status or a range such as 200-399")]),
            "Statuses that pass; default 200-399."),
    ])

    static let outlierDetection = Section("Endpoints failing in a row are ejected for base_ejection × times ejected.", [
        key("consecutive_failures", .integer(1...1000), "Failures in a row that eject; default 5."),
        key("base_ejection", .duration(positive: true), "Default 30s."),
        key("max_ejection", .percentage, "Most endpoints ejected at once; never the last one up; default 50%."),
        key("failures", words(OutlierDetectionConfig.Failures.self), "gateway (default: connect errors, resets, timeouts, 502/503/504) or 5xx (any 5xx too)."),
    ])

    static let circuitBreaker = Section("Limits for the whole upstream, shared by every thread.", [
        key("max_requests", .integer(1...1_000_000), "Requests in flight at once; default 1024."),
        key("max_pending", .integer(0...1_000_000), "Requests waiting for a connection beyond the endpoints' max_connections; default 1024."),
    ])

    static let adaptiveConcurrency = Section("A gradient limit on requests in flight: it grows while latency stays near the target, falls as it climbs.", [
        key("min", .integer(1...1_000_000), "The limit never falls below this; not above max; default 4."),
        key("max", .integer(1...1_000_000), "The limit never grows above this; default 1000."),
        key("sample_window", .duration(positive: true), "The limit is worked out again this often, from that time's answers; at least 10ms; default 250ms."),
        key("target_latency", .either([.pattern("^min_rtt\\s*[×*]\\s*[0-9]+(\\.[0-9]+)?$", note: "min_rtt × FACTOR (1 to 10)"), .duration(positive: true)]),
            "min_rtt × FACTOR (the fastest answer seen, times 1 to 10) or a fixed latency such as 200ms; default min_rtt × 1.5."),
    ])

    static let clientTLS = Section("TLS client settings; the urlsession transport on Linux refuses them (use transport: nio).", [
        key("ca_file", .nonEmptyText, "PEM roots trusted instead of the system store."),
        key("client_cert_file", .nonEmptyText, "Mutual TLS: PEM chain, leaf first (needs client_key_file)."),
        key("client_key_file", .nonEmptyText, "Unencrypted PEM key matching client_cert_file."),
        key("server_name", .hostName, "SNI and the name checked, instead of the URL's host."),
        key("min_version", words(TLSClientConfig.Version.self), "Default 1.2."),
        key("insecure_skip_verify", .boolean, "Accept any certificate (a warning at every load); default false."),
        key("pin_sha256", .list(.pattern("^[A-Za-z0-9+/]{43}=$", note: "base64 of a 32-byte SHA-256 digest"), unique: true, nonEmpty: true),
            "nio upstreams and token endpoints: the leaf's SubjectPublicKeyInfo SHA-256 (HPKP format) must match one."),
        key("verify", words(TLSClientConfig.Verification.self), "full (default: chain, host name and pin) or pin_only (self-signed upstreams; needs pin_sha256)."),
    ])

    static let credentialTypes: [(type: String, section: Section)] = [
        ("static", Section("A fixed header.", [
            key("header", .headerName, "Default Authorization."),
            required("value", .text, "The header value, from ${VAR} or ${file:...}; no CR/LF/NUL."),
        ])),
        ("basic", Section("HTTP Basic.", [
            required("username", .nonEmptyText, "No \":\"."),
            required("password", .text, "May be empty."),
        ])),
        ("oauth2_client_credentials", Section("OAuth2 client credentials grant: tokens fetched, cached and refreshed ahead of expiry.",
                                              oauth2Keys + tokenTimingKeys)),
        ("oauth2_refresh_token", Section("OAuth2 refresh token grant.", oauth2Keys + [
            required("refresh_token", .nonEmptyText, "The refresh token; a rotated one returned by the IdP is kept."),
        ] + tokenTimingKeys)),
    ]

    static let oauth2Keys: [Key] = [
        required("token_url", .url, "The token endpoint, http or https."),
        required("client_id", .nonEmptyText, "The client id."),
        required("client_secret", .nonEmptyText, "The client secret, from ${VAR} or ${file:...}."),
        key("client_auth", words(OAuth2Config.ClientAuthMethod.self), "Default client_secret_basic."),
        key("scope", .text, "Optional."),
        key("audience", .text, "Optional."),
        key("extra_params", .map(.text), "Extra form parameters for the token request."),
        key("transport", words(UpstreamConfig.Transport.self), "Token calls: urlsession (default) or nio (needed for any tls: key)."),
        key("tls", .section(clientTLS), "For an https token_url: the same keys as upstreams.NAME.tls."),
    ]

    static let tokenTimingKeys: [Key] = [
        key("refresh_before_expiry", .duration(), "Refresh this long before expiry; default 30s."),
        key("default_lifetime", .duration(positive: true), "Assumed lifetime when the response has no expires_in; default 300s."),
        key("timeout", .duration(positive: true), "One call to the token endpoint; default 10s."),
        key("backoff_base", .duration(positive: true), "While the IdP fails, the nth retry waits a random part of min(backoff_cap, backoff_base*2^(n-1)); default 500ms."),
        key("backoff_cap", .duration(positive: true), "Default 30s; not below backoff_base."),
        key("store", .reference(section: "stores"), "A name under stores: to share the token with every replica (one refresh per fleet); default this process only."),
        key("encryption_key", .either([.nonEmptyText, .list(.nonEmptyText, unique: true, nonEmpty: true)]),
            "With store (required): 32 random bytes in base64, or a list (the first seals, all open: rotation)."),
    ]

    static let storeTypes: [(type: String, section: Section)] = StoreConfig.supportedTypes.map { ($0, redisStore) }

    static let redisStore = Section("A Redis server shared by every replica's rate limits and quotas.", [
        required("url", .pattern("^rediss?://", note: "a redis:// or rediss:// URL"), "redis://[user:password@]host[:port][/db]; rediss:// for TLS."),
        key("password", .text, "Overrides a password in the URL; never logged."),
        key("tls", .section(clientTLS), "rediss:// only: the upstream tls keys."),
        key("pool", .integer(1...1024), "Connections (commands are pipelined on them), spread over the event loops, at least one each: a request's command goes out on its own loop; default 8."),
        key("timeout", .duration(positive: true), "The most a request waits for Redis, connecting included; default 25ms."),
        key("connect_timeout", .duration(positive: true), "Bound on opening one connection; default 2s."),
        key("key_prefix", .text, "Before every key; default \"portico:\"."),
    ])

    /// Keyed by `MiddlewareRegistry.standard`'s words; the drift test checks the two agree.
    static let middlewareTypes: [(type: String, section: Section)] = [
        ("access_log", Section("One structured line per request.", [
            key("redact_headers", .list(.headerName), "Default [authorization, proxy-authorization, cookie, set-cookie]; a list replaces it."),
            key("redact_query", .list(.nonEmptyText), "Query parameters whose values are redacted; default none."),
            key("include_headers", .list(.headerName), "Extra request headers in the line; default none."),
        ])),
        ("auth", Section("Inject a credential into upstream requests.", [
            required("credential", .reference(section: "credentials"), "A name under credentials:."),
            key("client_header", words(AuthConfig.ClientHeaderPolicy.self), "override (default) or keep_if_present."),
        ])),
        ("headers", Section("Set, add and remove request headers before the upstream and response headers before the client.", [
            key("request", .section(headerRules), "Rules applied to the request on its way to the upstream."),
            key("response", .section(headerRules), "Rules applied to the response on its way to the client."),
        ])),
        ("cache", Section("Shared HTTP cache (RFC 9111) in memory, and on Redis with store:.", [
            key("max_bytes", .size(minimum: 1024), "All stored responses together; default 64MiB."),
            key("max_object_bytes", .size(), "Larger bodies pass through unstored; at most max_bytes; default 1MiB."),
            key("heuristic_fraction", .percentage, "Last-Modified responses without a lifetime stay fresh this share of their age; default 0%."),
            key("heuristic_max", .duration(), "Cap of a heuristic lifetime; default 24h."),
            key("stale_while_revalidate", .duration(), "For responses without their own; default 0."),
            key("stale_if_error", .duration(), "For responses without their own; default 0."),
            key("revalidation_timeout", .duration(positive: true), "Deadline of a background refresh; default 10s."),
            key("max_in_flight", .integer(1...1_000_000), "Keys others can wait on, and background refreshes, at once; default 1024."),
            key("x_cache", .boolean, "Also send X-Cache; default false."),
            key("targeted_cache_control", .list(.headerName), "RFC 9213 fields obeyed before Cache-Control, e.g. [CDN-Cache-Control]; default none."),
            key("store", .reference(section: "stores"), "A name under stores: a second tier on Redis shared by every replica (one fetch per URL for the fleet; invalidations and purges reach all); default memory only."),
            key("max_entry_bytes", .size(), "With store: larger responses stay in memory only; default 1MiB."),
            key("store_wait", .duration(positive: true), "With store: how long a replica waits for the one fetching a missing URL for the fleet; default 1s."),
        ])),
        ("compress", Section("gzip responses for clients that accept it.", [
            key("level", .integer(1...9), "zlib level; default 6."),
            key("min_bytes", .size(minimum: 0), "Smaller bodies are sent as they are; default 1KiB."),
            key("types", .list(.pattern("^([A-Za-z0-9!#$&^_.+-]+|\\*)/([A-Za-z0-9!#$&^_.+-]+|\\*|\\*\\+[A-Za-z0-9!#$&^_.-]+)$", note: "type/subtype, type/*, */*+suffix or */*"), unique: true, nonEmpty: true),
                "Content-Type patterns; a list replaces the default."),
            key("window_bits", .integer(9...15), "zlib window 2^n bytes; default 15."),
            key("mem_level", .integer(1...9), "zlib hash memory; default 8."),
        ])),
        ("quota", Section("Requests per calendar window (hour, day, month) in a shared store, split by allocations; 429 quota_exhausted beyond it.", [
            required("limit", .integer(1...1_000_000_000_000), "Requests per window, all allocations together."),
            required("per", words(QuotaConfig.Period.self), "The calendar window: hour, day or month."),
            required("store", .reference(section: "stores"), "A name under stores: the counts survive restarts and hold across replicas."),
            key("key", .either([rateLimitKeyPart, .list(rateLimitKeyPart, unique: true, nonEmpty: true)]),
                "What picks the allocation: client_ip, route, header:NAME or a list (values joined by +); default none."),
            key("timezone", .pattern("^([+-][0-9]{2}:[0-9]{2}|[A-Za-z][A-Za-z0-9_+/-]*)$", note: "an IANA zone name or an offset such as +02:00"),
                "Whose calendar: an IANA zone (Europe/Paris) or a fixed offset (+02:00); default UTC."),
            key("allocations", .map(.percentage), "A key's share of limit; keys not listed share what is left, or default: N%; at most 100% together."),
            key("on_store_error", words(QuotaConfig.StoreErrorPolicy.self), "When Redis fails: local (default; count on from the last count), allow or deny."),
            key("headers", .boolean, "RateLimit-Policy / RateLimit headers; default true."),
        ])),
        ("rate_limit", Section("A token bucket per key; 429 rate_limited beyond it.", [
            required("rate", .rate, "Sustained rate: 100/s, 6000/m, 5/10s."),
            key("key", .either([rateLimitKeyPart, .list(rateLimitKeyPart, unique: true, nonEmpty: true)]),
                "client_ip (default), route, header:NAME, or a list combining them."),
            key("burst", .integer(1...1_000_000_000), "Bucket size; default one second of rate, rounded up."),
            key("missing_key", words(RateLimitConfig.MissingKey.self), "shared (default) or reject (400 rate_limit_key_missing)."),
            key("headers", .boolean, "RateLimit-Policy / RateLimit headers; default true."),
            key("max_keys", .integer(1...100_000_000), "Buckets kept in memory at most; default 100000."),
            key("store", .reference(section: "stores"), "A name under stores: to share the buckets; default in memory."),
            key("on_store_error", words(RateLimitConfig.StoreErrorPolicy.self), "With store, when Redis fails: local (default), allow or deny."),
            key("on_limit", words(RateLimitConfig.OnLimit.self), "Over the limit: reject (default; 429 at once) or wait for the token."),
            key("max_wait", .duration(positive: true), "on_limit: wait: the longest a request waits (never past its deadline); a longer wait is 429 at once; default 1s."),
            key("max_waiting", .integer(1...10_000_000), "on_limit: wait: requests waiting at once; beyond, 429 at once; default 10000."),
            key("priority", .pattern("^header:[!#$%&'*+.^_`|~0-9A-Za-z-]+$", note: "header:NAME"),
                "on_limit: wait: header:NAME whose value (high, normal, low; else normal) orders a bucket's waiters; higher go first, none past its max_wait."),
        ])),
        ("retry", Section("Repeat failed upstream attempts.", [
            key("attempts", .integer(1...10), "Total attempts, the first included; default 3."),
            key("on", .list(.either([.choice(RetryConfig.conditionWords), .integer(500...599), .integer(429...429)]), unique: true),
                "Default [connect_error, timeout, reset, 502, 503, 504]."),
            key("methods", .list(.pattern("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", note: "an HTTP method"), unique: true), "Default [GET, HEAD, OPTIONS, PUT, DELETE]."),
            key("backoff", .section(Section("Full jitter: retry n waits random [0, min(cap, base*2^(n-1))].", [
                key("base", .duration(), "Default 25ms."),
                key("cap", .duration(), "Default 1s; not below base."),
            ])), "Backoff between attempts."),
            key("per_try_timeout", .duration(positive: true), "Each attempt's deadline, inside the request's; default none."),
            key("budget", .percentage, "Retries add at most this on top of requests; default 20%."),
            key("min_retries_per_second", .integer(0...100_000), "Retries allowed regardless of traffic; default 3."),
            key("max_retry_after", .duration(), "A longer upstream Retry-After goes back to the client at once; default 5s."),
            key("hedge", .section(Section("Race an attempt still without a response head by another (idempotent methods only; each hedge takes one from budget).", [
                key("after", .either([.pattern("^p[0-9]+(\\.[0-9]+)?$", note: "a percentile p50-p99.9"), .duration(positive: true)]),
                    "p50-p99.9 of the route's recent upstream latency, or a fixed delay; default p90."),
                key("min", .duration(), "The delay is never shorter; default 20ms."),
                key("max_extra", .integer(1...3), "Hedges one request may send in all; default 1."),
            ])), "Hedged requests: the first good response head wins, the others are cancelled; default none."),
        ])),
    ]

    /// Header values are templates read as written (no `${VAR}` interpolation): `${request_id}`,
    /// `${client_ip}`, `${route}`, `${upstream}`, `${env:NAME}`, `$${` for a literal `${`.
    static let headerRules = Section("remove, then set, then add; Host, Content-Length and hop-by-hop fields are refused.", [
        key("remove", .list(.headerName, unique: true), "Drop every field of these names."),
        key("set", .map(.text, keys: .headerName), "Replace every field of each name with this value template."),
        key("add", .map(.text, keys: .headerName), "Append a field with this value template beside those already there."),
    ])

    static let rateLimitKeyPart = Value.pattern("^(client_ip|route|header:[!#$%&'*+.^_`|~0-9A-Za-z-]+)$", note: "client_ip, route or header:NAME")

    static let defaults = Section("Defaults for routes.", [
        key("middleware", .list(.reference(section: "middleware"), unique: true), "Middleware names, outermost first, for routes that do not list their own; default none."),
    ])

    static let route = Section("A route: what it matches and where it goes.", rules: [.exactlyOne(["upstream", "direct"])], [
        required("name", .nonEmptyText, "Unique; the route label in metrics and logs."),
        required("match", .section(match), "What requests the route takes."),
        key("upstream", .reference(section: "upstreams"), "A name under upstreams: (or direct:, not both)."),
        key("direct", .section(direct), "Answer without an upstream."),
        key("strip_prefix", .boolean, "Remove match.path_prefix before forwarding; default false."),
        key("middleware", .list(.reference(section: "middleware"), unique: true), "Outermost first; absent: defaults.middleware; []: none."),
        key("timeout", .duration(positive: true), "Overrides listen.request_timeout for this route."),
        key("max_in_flight", .integer(1...Int.max), "This route's own cap (503 overloaded beyond); default none."),
        key("stream_idle_timeout", .duration(positive: true), "Longest silence between two chunks of a streamed body; default 60s."),
        key("max_stream_duration", .duration(positive: true), "Longest a streamed response may last; default none."),
        key("websocket", .boolean, "Pass WebSocket handshakes through (nio upstreams; short for upgrade: [websocket]); default false."),
        key("upgrade", .list(.pattern("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", note: "a protocol token such as websocket"), unique: true),
            "Protocols a client may switch to through this route; default none."),
        key("websocket_idle_timeout", .duration(positive: true), "Close a session with no byte either way for this long; default 1h."),
    ])

    static let match = Section("At least one of path, path_prefix, host; methods narrows further.",
                               rules: [.atLeastOne(["path", "path_prefix", "host"]), .notTogether(["path", "path_prefix"])], [
        key("path", .absolutePath, "Exact path."),
        key("path_prefix", .absolutePath, "Path prefix; the longest matching prefix wins."),
        key("host", .pattern("^(\\*\\.)?[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*$", note: "a host such as api.example.com or *.example.com, without port"),
            "Case-insensitive; \"*.\" matches one or more labels."),
        key("methods", .list(.pattern("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", note: "an HTTP method"), unique: true), "Default: all methods."),
    ])

    static let direct = Section("A canned response.", [
        key("status", .integer(100...599), "Default 200."),
        key("body", .text, "Default empty."),
        key("headers", .map(.headerValue, keys: .headerName), "In order; Content-Length is computed."),
    ])
}

extension ConfigSchema.Value {
    static let headerName = Self.pattern("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", note: "a header field name")
    static let headerValue = Self.text
    static let hostName = Self.pattern("^[A-Za-z0-9.-]+$", note: "a DNS host name, without port")
    static let absolutePath = Self.pattern("^/[^\\u0000-\\u0020\\u007f]*$", note: "a path starting with /, without spaces")
}
