import HTTPTypes

/// One configured route: how it matches, and the chain that answers it. A class: every request
/// carries its route through the chain, and a reference is one retain where a struct of these
/// fields was a dozen.
public final class Route: Sendable {
    public let name: String
    public let matcher: Matcher
    /// Removes the matched `path_prefix` before forwarding.
    public let stripPrefix: Bool
    /// The upstream's name, for proxy routes.
    public let upstream: String?
    /// Overrides the listener's request timeout.
    public let timeout: Duration?
    /// The longest silence between two chunks of a streamed body (`stream_idle_timeout`).
    public let streamIdleTimeout: Duration
    /// The longest a streamed response may last (`max_stream_duration`); `nil`: no limit.
    public let maxStreamDuration: Duration?
    /// The route's own cap on requests in flight, if any.
    public let inFlight: InFlightLimit?
    /// The largest request body its endpoint can take, below the listener's (`urlsession` reads a
    /// streamed upload whole): a larger declared length is refused at the head, unread.
    public let maxRequestBodyBytes: Int?
    /// Protocols a client may upgrade to on this route (`websocket: true`: `websocket`); empty: none.
    public let upgrade: Set<String>
    /// An upgraded session quiet both ways this long is closed (`websocket_idle_timeout`).
    public let websocketIdleTimeout: Duration
    /// The route's middleware around its endpoint.
    public let responder: any Responder
    /// The outermost `access_log` of the route's chain: it also logs the requests the gateway
    /// refuses for this route before the chain runs (its `max_in_flight`).
    public let accessLog: AccessLogMiddleware?

    public init(name: String, matcher: Matcher, stripPrefix: Bool = false, upstream: String? = nil,
                timeout: Duration? = nil, streamIdleTimeout: Duration = .seconds(60), maxStreamDuration: Duration? = nil,
                inFlight: InFlightLimit? = nil, maxRequestBodyBytes: Int? = nil, responder: any Responder,
                accessLog: AccessLogMiddleware? = nil, upgrade: Set<String> = [],
                websocketIdleTimeout: Duration = .seconds(3600)) {
        self.upgrade = upgrade
        self.websocketIdleTimeout = websocketIdleTimeout
        self.maxRequestBodyBytes = maxRequestBodyBytes
        self.name = name
        self.matcher = matcher
        self.stripPrefix = stripPrefix
        self.upstream = upstream
        self.timeout = timeout
        self.streamIdleTimeout = streamIdleTimeout
        self.maxStreamDuration = maxStreamDuration
        self.inFlight = inFlight
        self.responder = responder
        self.accessLog = accessLog
    }

    /// The target sent upstream: the client's, less the matched prefix when `strip_prefix` is set.
    public func upstreamTarget(for target: String) -> String {
        guard stripPrefix, let prefix = matcher.pathPrefix else { return target }
        return PrefixStripping.strip(prefix, from: target)
    }
}
