/// `GET /routes`: the route table as loaded — how each route matches, where it goes, its chain
/// in order and which steps may answer without going further in.
public struct RouteTable: Sendable, Encodable {
    public struct Match: Sendable, Encodable, Equatable {
        public var methods: [String]
        public var host: String?
        public var path: String?
        public var pathPrefix: String?

        init(_ match: RouteConfig.Match) {
            methods = match.methods
            host = match.host
            path = match.path
            pathPrefix = match.pathPrefix
        }

        /// `GET,POST *.example.com /orders/*`
        var text: String {
            var parts = [methods.isEmpty ? "any method" : methods.joined(separator: ",")]
            if let host { parts.append("host \(host)") }
            if let path { parts.append("path \(path)") }
            if let pathPrefix { parts.append("prefix \(pathPrefix)") }
            return parts.joined(separator: " ")
        }

        enum CodingKeys: String, CodingKey {
            case methods, host, path
            case pathPrefix = "path_prefix"
        }
    }

    /// Where a route's chain ends.
    public struct Endpoint: Sendable, Encodable, Equatable {
        /// `upstream` or `direct`.
        public var kind: String
        public var upstream: String?
        public var url: String?
        public var transport: String?
        /// A direct route's status.
        public var status: Int?
    }

    public struct Step: Sendable, Encodable, Equatable {
        /// The `middleware.NAME` key.
        public var name: String
        /// Its `type:`.
        public var type: String
        public var description: StepDescription

        enum CodingKeys: String, CodingKey {
            case name, type, description
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(name, forKey: .name)
            try container.encode(type, forKey: .type)
            try description.encode(to: encoder)
        }
    }

    public struct Entry: Sendable, Encodable {
        public var name: String
        public var match: Match
        public var endpoint: Endpoint
        public var stripPrefix: Bool
        /// The route's `timeout`, else `listen.request_timeout`, in seconds.
        public var timeoutSeconds: Double
        public var chain: [Step]
        /// What can answer without reaching the endpoint, outermost first: `cache: a fresh stored response (hit)`.
        public var answersAtOnce: [String]

        enum CodingKeys: String, CodingKey {
            case name, match, endpoint, chain
            case stripPrefix = "strip_prefix"
            case timeoutSeconds = "timeout_seconds"
            case answersAtOnce = "answers_at_once"
        }
    }

    public var routes: [Entry]

    public init(_ runtime: GatewayRuntime) {
        routes = runtime.config.routes.map { route in
            let chain = Self.chain(of: route, in: runtime, for: nil)
            var immediate = chain.compactMap { step in step.description.answersAtOnce.map { "\(step.name): \($0)" } }
            if let direct = route.direct { immediate.append("direct response \(direct.status)") }
            return Entry(name: route.name, match: Match(route.match), endpoint: Self.endpoint(of: route, in: runtime.config),
                         stripPrefix: route.stripPrefix, timeoutSeconds: (route.timeout ?? runtime.config.listen.requestTimeout).secondsValue,
                         chain: chain, answersAtOnce: immediate)
        }
    }

    /// The route's middleware, outermost first, each describing itself (for `request` when given).
    static func chain(of route: RouteConfig, in runtime: GatewayRuntime, for request: ExplainedRequest?) -> [Step] {
        (route.middleware ?? runtime.config.defaults.middleware).compactMap { name in
            guard let instance = runtime.middleware[name] else { return nil }
            return Step(name: name, type: runtime.config.middleware[name]?.typeName ?? "?",
                        description: instance.describe(for: request))
        }
    }

    static func endpoint(of route: RouteConfig, in config: PorticoConfig) -> Endpoint {
        if let direct = route.direct {
            return Endpoint(kind: "direct", status: direct.status)
        }
        let upstream = route.upstream.flatMap { config.upstreams[$0] }
        return Endpoint(kind: "upstream", upstream: route.upstream, url: upstream?.url.absoluteString,
                        transport: upstream?.transport.rawValue)
    }
}
