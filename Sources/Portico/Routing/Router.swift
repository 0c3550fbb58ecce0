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
