import Foundation

/// `upstreams.NAME`
public struct UpstreamConfig: Sendable, Equatable {
    public enum Transport: String, Sendable, Equatable, CaseIterable {
        /// Foundation's URLSession: the specified client.
        case urlsession
        /// Portico's own HTTP/1.1 pool on SwiftNIO (`HTTP1ConnectionPool`): for throughput; also
        /// HTTP/2 (`protocol: http2 | auto`, `HTTP2ConnectionPool`).
        case nio
    }

    public var name: String
    /// Base URL: scheme, host, port and an optional base path the route's target is joined onto.
    /// With `endpoints`, the first of them.
    public var url: URL
    /// Every endpoint, same scheme and base path (`endpoints:`, or `url:` alone: one endpoint).
    public var endpoints: [URL]
    /// How an endpoint is picked per attempt when there are several.
    public var balance: BalanceStrategy = .roundRobin
    public var outlierDetection = OutlierDetectionConfig()
    /// `nil`: no breaker (requests wait for a connection up to `connect_timeout`). `concurrency: N`
    /// is a breaker of `max_requests: N`.
    public var circuitBreaker: CircuitBreakerConfig?
    /// `concurrency: adaptive`: a limit that follows the upstream's latency; `nil`: none.
    public var adaptiveConcurrency: AdaptiveConcurrencyConfig?
    /// `nil`: no active checks (ejection alone judges an endpoint).
    public var healthCheck: HealthCheckConfig?
    /// `dns_refresh`: the `url`'s host name stands for every address it resolves to, resolved
    /// again this often (transport `nio`); `nil`: the transport resolves it per connection.
    public var dnsRefresh: Duration?
    /// The `Host` (authority) sent instead of the URL's: a resolved endpoint's URL names an
    /// address, its upstream still hears its name. Set by the gateway, not by the file.
    public var requestAuthority: String?
    public var transport: Transport = .urlsession
    /// `protocol:` — HTTP/1.1, HTTP/2 or ALPN's choice (`nio` only for HTTP/2).
    public var httpProtocol: UpstreamProtocol = .http1
    /// `http2:` — the HTTP/2 connections' limits and keepalive.
    public var http2 = HTTP2Config()
    public var connectTimeout: Duration = .seconds(2)
    /// One exchange with the upstream (the request deadline may cut it shorter).
    public var timeout: Duration = .seconds(15)
    public var maxConnections: Int = 64
    /// A pooled connection idle this long is closed (transport `nio`). Kept below the 5 s
    /// keep-alive of Node.js, uvicorn and Apache: an upstream closes an idle connection on its
    /// own timer, and a request sent on it in that instant fails; the pool must let go first.
    public var idleTimeout: Duration = .seconds(4)
    /// Send the client's `Host` instead of the upstream's.
    public var preserveHost: Bool = false
    /// `host_header:` — the `Host` sent instead of the URL's authority (a virtual host behind
    /// a shared address). Set after header hygiene, on both transports; TLS still verifies the
    /// URL's host (or `tls.server_name`). Cannot be combined with `preserve_host`.
    public var hostHeader: String?
    /// Upstream bodies larger than this become 502 `upstream_response_too_large` (declared), or
    /// are cut as they flow. Unset in the file: no limit on `nio` (its streams are slowed to the
    /// client's pace), 64 MiB on `urlsession`, which cannot slow the upstream: this bounds what
    /// a slow client can make it queue.
    public var maxResponseBytes: Int = 64 * 1024 * 1024
    /// A streamed request body is read whole before it is sent, up to this many bytes (413
    /// `payload_too_large` beyond), by the `urlsession` transport, which cannot stream uploads.
    /// The gateway sets it to `listen.max_body_bytes`, at most `maxBufferedUpload`.
    public var maxRequestBodyBytes: Int = 10 * 1024 * 1024
    /// The most a `urlsession` upstream holds of one streamed upload.
    public static let maxBufferedUpload = 64 * 1024 * 1024
    /// `tls:` for an `https://` upstream; the default verifies against the system trust store.
    public var tls = TLSClientConfig()
    /// Learn the provider's limits from its responses and hold back what it would refuse.
    public var providerLimits: ProviderLimitsConfig?

    /// `host_header`, else the name a resolved endpoint stands for (`requestAuthority`), else the URL's.
    func sentHost(_ target: UpstreamTarget) -> String {
        hostHeader ?? requestAuthority ?? target.authority
    }

    public init(name: String, url: URL) {
        self.name = name
        self.url = url
        self.endpoints = [url]
    }

    /// An upstream over several endpoints (`endpoints` must not be empty).
    public init(name: String, endpoints: [URL]) {
        precondition(!endpoints.isEmpty, "an upstream needs at least one endpoint")
        self.name = name
        self.url = endpoints[0]
        self.endpoints = endpoints
    }

    /// The most endpoints one upstream may have (metric labels and per-loop tables stay bounded).
    public static let maxEndpoints = 64
}
