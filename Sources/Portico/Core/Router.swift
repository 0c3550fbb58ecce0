import HTTPTypes

/// Picks the route for a request. Built once per configuration; matching allocates nothing
/// beyond the lower-cased host.
public struct Router: Sendable {
    public enum Match: Sendable {
        case route(Route)
        case notFound
        /// Routes matched the path but none allows the method.
        case methodNotAllowed(allow: [String])
    }

    public let routes: [Route]
    /// Whether any route matches on the host: otherwise the host is never looked at.
    private let matchesHosts: Bool

    public init(routes: [Route]) {
        self.routes = routes
        matchesHosts = routes.contains { $0.matcher.host != nil }
    }

    /// `host` is the request's `Host` (any port is ignored); `path` the raw path without query.
    public func match(method: HTTPRequest.Method, host: String?, path: Substring) -> Match {
        let hostname = matchesHosts ? host.map(Route.Matcher.hostname(of:)) : nil
        var best: (index: Int, rank: Route.Matcher.Rank)?
        var allowed: Set<String> = []
        var pathMatched = false
        for index in routes.indices {
            guard let rank = routes[index].matcher.rank(host: hostname, path: path) else { continue }
            pathMatched = true
            guard routes[index].matcher.allows(method) else {
                allowed.formUnion(routes[index].matcher.methods)
                continue
            }
            if best == nil || rank > best!.rank {
                best = (index, rank)
            }
        }
        if let best { return .route(routes[best.index]) }
        if pathMatched { return .methodNotAllowed(allow: allowed.sorted()) }
        return .notFound
    }
}

/// One configured route: how it matches, and the chain that answers it.
public struct Route: Sendable {
    public struct Matcher: Sendable {
        public var path: String?
        public var pathPrefix: String?
        /// Lower-cased; `*.example.com` matches any subdomain.
        public var host: String?
        /// Upper-cased method names; empty allows all.
        public var methods: Set<String>

        public init(path: String? = nil, pathPrefix: String? = nil, host: String? = nil, methods: [String] = []) {
            self.path = path
            self.pathPrefix = pathPrefix
            self.host = host?.lowercased()
            self.methods = Set(methods.map { $0.uppercased() })
        }

        /// More specific matches rank higher: a host, then an exact path, then a longer prefix.
        public struct Rank: Comparable, Sendable {
            var hostSpecific: Bool
            var exactPath: Bool
            var prefixLength: Int
            public static func < (a: Rank, b: Rank) -> Bool {
                (a.hostSpecific ? 1 : 0, a.exactPath ? 1 : 0, a.prefixLength)
                    < (b.hostSpecific ? 1 : 0, b.exactPath ? 1 : 0, b.prefixLength)
            }
        }

        /// The rank when host and path match, ignoring the method.
        func rank(host requestHost: String?, path requestPath: Substring) -> Rank? {
            if let host {
                guard let requestHost, Self.hostMatches(pattern: host, host: requestHost) else { return nil }
            }
            if let path, !requestPath.utf8.elementsEqual(path.utf8) { return nil }
            var prefixLength = 0
            if let pathPrefix {
                guard Self.prefixMatches(prefix: pathPrefix, path: requestPath) else { return nil }
                prefixLength = pathPrefix.utf8.count
            }
            return Rank(hostSpecific: host != nil, exactPath: path != nil, prefixLength: prefixLength)
        }

        func allows(_ method: HTTPRequest.Method) -> Bool {
            methods.isEmpty || methods.contains(method.rawValue)
                || (method == .head && methods.contains("GET"))
        }

        /// A prefix ending in `/` matches as a string; otherwise it matches whole segments
        /// (`/api` matches `/api` and `/api/x`, not `/apix`).
        static func prefixMatches(prefix: String, path: Substring) -> Bool {
            // Bytes, not characters: paths are compared as sent, with no Unicode normalisation.
            guard path.utf8.starts(with: prefix.utf8) else { return false }
            if prefix.utf8.last == UInt8(ascii: "/") { return true }
            let rest = path.utf8.dropFirst(prefix.utf8.count)
            return rest.isEmpty || rest.first == UInt8(ascii: "/")
        }

        static func hostMatches(pattern: String, host: String) -> Bool {
            if pattern.hasPrefix("*.") {
                let suffix = pattern.dropFirst(1)  // ".example.com"
                return host.hasSuffix(suffix) && host.count > suffix.count
            }
            return pattern == host
        }

        /// `Example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
        static func hostname(of host: String) -> String {
            var value = Substring(host)
            if value.hasPrefix("[") {
                if let close = value.firstIndex(of: "]") { value = value[...close] }
            } else if let colon = value.lastIndex(of: ":") {
                value = value[..<colon]
            }
            return value.lowercased()
        }
    }

    public var name: String
    public var matcher: Matcher
    /// Removes the matched `path_prefix` before forwarding.
    public var stripPrefix: Bool
    /// The upstream's name, for proxy routes.
    public var upstream: String?
    /// Overrides the listener's request timeout.
    public var timeout: Duration?
    /// The route's own cap on requests in flight, if any.
    public var inFlight: InFlightLimit?
    /// The route's middleware around its endpoint.
    public var responder: any Responder
    /// The outermost `access_log` of the route's chain: it also logs the requests the gateway
    /// refuses for this route before the chain runs (its `max_in_flight`).
    public var accessLog: AccessLogMiddleware?

    public init(name: String, matcher: Matcher, stripPrefix: Bool = false, upstream: String? = nil,
                timeout: Duration? = nil, inFlight: InFlightLimit? = nil, responder: any Responder) {
        self.name = name
        self.matcher = matcher
        self.stripPrefix = stripPrefix
        self.upstream = upstream
        self.timeout = timeout
        self.inFlight = inFlight
        self.responder = responder
    }

    /// The target sent upstream: the client's, less the matched prefix when `strip_prefix` is set.
    public func upstreamTarget(for target: String) -> String {
        guard stripPrefix, let prefix = matcher.pathPrefix else { return target }
        var trimmedPrefix = Substring(prefix)
        if trimmedPrefix.hasSuffix("/") { trimmedPrefix = trimmedPrefix.dropLast() }
        guard target.hasPrefix(trimmedPrefix) else { return target }
        let rest = target.dropFirst(trimmedPrefix.count)
        if rest.isEmpty { return "/" }
        if rest.first == "?" { return "/" + rest }
        return String(rest)
    }
}

/// A `direct:` route's endpoint.
public struct DirectResponder: Responder {
    public let response: GatewayResponse

    public init(status: Int, headers: [(String, String)], body: String) {
        var fields = HTTPFields()
        for (name, value) in headers {
            if let fieldName = HTTPField.Name(name) { fields.append(HTTPField(name: fieldName, value: value)) }
        }
        response = GatewayResponse(status: HTTPResponse.Status(code: status), headerFields: fields, body: Body(string: body))
    }

    public func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        response
    }

    public func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse? {
        response
    }

    public var answersImmediately: Bool { true }
}
