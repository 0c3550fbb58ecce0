/// `upstreams.NAME.protocol`: which HTTP version the `nio` transport speaks to the upstream.
public enum UpstreamProtocol: String, Sendable, Equatable, CaseIterable {
    /// HTTP/1.1, one exchange per connection at a time (`HTTP1ConnectionPool`): the default.
    case http1
    /// HTTP/2 only: prior knowledge (h2c) over `http://`, ALPN `h2` over `https://` (a server
    /// that does not pick h2 fails the exchange: 502 `upstream_protocol_error`).
    case http2
    /// `https://` only: ALPN offers `h2` and `http/1.1`; the upstream's choice decides, and a
    /// server that does not pick h2 is spoken to on HTTP/1.1 from then on.
    case auto
}

/// `upstreams.NAME.http2`: the HTTP/2 connections of one endpoint (`HTTP2ConnectionPool`).
public struct HTTP2Config: Sendable, Equatable {
    /// The most streams Portico opens on one connection, below the peer's own
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` when that is smaller.
    public var maxConcurrentStreams: Int = 100
    /// Connections each event loop keeps per endpoint when all the others are full (within
    /// `max_connections` for the whole upstream).
    public var connectionsPerLoop: Int = 1
    /// A connection silent this long is sent a PING.
    public var pingInterval: Duration = .seconds(30)
    /// A PING unanswered this long closes the connection (its streams fail, retryable).
    public var pingTimeout: Duration = .seconds(5)

    public init() {}

    /// `max_concurrent_streams`' range: RFC 9113 lets a peer allow 2^31-1, this keeps a
    /// connection's stream table bounded.
    public static let streamLimit = 1...10_000
    public static let connectionsLimit = 1...64
}
