import HTTPTypes

/// One configured route: how it matches, and the chain that answers it.
public struct Route: Sendable {
    public var name: String
    public var matcher: Matcher
    /// Removes the matched `path_prefix` before forwarding.
    public var stripPrefix: Bool
    /// The upstream's name, for proxy routes.
    public var upstream: String?
    /// Overrides the listener's request timeout.
    public var timeout: Duration?
    /// The longest silence between two chunks of a streamed body (`stream_idle_timeout`).
    public var streamIdleTimeout: Duration = .seconds(60)
    /// The longest a streamed response may last (`max_stream_duration`); `nil`: no limit.
    public var maxStreamDuration: Duration?
    /// The route's own cap on requests in flight, if any.
    public var inFlight: InFlightLimit?
    /// The route's middleware around its endpoint.
    public var responder: any Responder
    /// The outermost `access_log` of the route's chain: it also logs the requests the gateway
    /// refuses for this route before the chain runs (its `max_in_flight`).
    public var accessLog: AccessLogMiddleware?

    public init(name: String, matcher: Matcher, stripPrefix: Bool = false, upstream: String? = nil,
                timeout: Duration? = nil, inFlight: InFlightLimit? = nil, responder: any Responder,
                accessLog: AccessLogMiddleware? = nil) {
        self.name = name
        self.matcher = matcher
        self.stripPrefix = stripPrefix
        self.upstream = upstream
        self.timeout = timeout
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
