import HTTPTypes
import Logging
import MicroHTTPD

/// What the gateway would do with one request, without sending it: the route that matches and
/// why the more specific ones did not, the chain step by step, the upstream URL and the
/// deadlines. `portico explain` prints `text`; `GET /explain` answers the same value as JSON.
public struct Explanation: Sendable, Encodable {
    /// What was asked.
    public struct Asked: Sendable, Encodable {
        public var method: String
        public var host: String?
        public var target: String
        /// `Name: value`, with the values of credential-bearing headers redacted.
        public var headers: [String]
    }

    /// Why a route did or did not take the request.
    public enum Verdict: Sendable, Equatable, EncodedAsString, CustomStringConvertible {
        case chosen
        /// `match.host` does not cover the request's host (or the request has none).
        case hostMismatch(pattern: String, host: String?)
        /// `match.path` is not the request's path.
        case pathMismatch(path: String)
        /// `match.path_prefix` does not start the request's path (whole segments unless it ends in `/`).
        case prefixMismatch(prefix: String)
        /// Host and path match, but the method is not among `match.methods`.
        case methodNotAllowed(method: String, allowed: [String])
        /// It matches too, but the chosen route is more specific.
        case outranked(by: String)

        /// The `verdict` word in JSON.
        public var code: String {
            switch self {
            case .chosen: "chosen"
            case .hostMismatch: "host"
            case .pathMismatch: "path"
            case .prefixMismatch: "prefix"
            case .methodNotAllowed: "method"
            case .outranked: "less_specific"
            }
        }

        public var description: String {
            switch self {
            case .chosen: "matches"
            case .hostMismatch(let pattern, let host):
                "host \(host.map { "\"\($0)\"" } ?? "(none)") is not \(pattern)"
            case .pathMismatch(let path): "path is not \(path)"
            case .prefixMismatch(let prefix): "path does not start with \(prefix)"
                + (prefix.hasSuffix("/") ? "" : " (as a whole segment)")
            case .methodNotAllowed(let method, let allowed):
                "method \(method) is not in [\(allowed.joined(separator: ", "))]"
            case .outranked(let route): "matches, but \(route) is more specific"
            }
        }

        public var encodedString: String { code }
    }

    public struct Candidate: Sendable, Encodable {
        public var route: String
        public var match: String
        public var verdict: Verdict
        public var reason: String
    }

    /// How routing ended.
    public enum Outcome: Sendable, Equatable, EncodedAsString, CustomStringConvertible {
        case route(String)
        case notFound
        case methodNotAllowed(allow: [String])

        public var description: String {
            switch self {
            case .route(let name): "route \(name)"
            case .notFound: "no route: 404 not_found"
            case .methodNotAllowed(let allow): "no route allows the method: 405 method_not_allowed (Allow: \(allow.joined(separator: ", ")))"
            }
        }

        public var encodedString: String { description }
    }

    public struct Deadlines: Sendable, Encodable {
        public var totalSeconds: Double
        /// Where `total` comes from: `routes[orders].timeout` or `listen.request_timeout`.
        public var totalFrom: String
        /// One upstream attempt; `nil` for a direct route.
        public var perTrySeconds: Double?
        public var perTryFrom: String?

        enum CodingKeys: String, CodingKey {
            case totalSeconds = "total_seconds", totalFrom = "total_from"
            case perTrySeconds = "per_try_seconds", perTryFrom = "per_try_from"
        }
    }

    public var asked: Asked
    /// Every route, most specific first, with why it did or did not take the request.
    public var candidates: [Candidate]
    public var outcome: Outcome
    public var chain: [RouteTable.Step]
    public var endpoint: RouteTable.Endpoint?
    /// The URL the upstream would be asked for, after `strip_prefix`.
    public var upstreamURL: String?
    /// The upstream's endpoints (`host:port`, as configured) one is picked from per attempt, and how.
    public var upstreamEndpoints: [String]?
    public var balance: String?
    /// Each endpoint's status on this gateway now, as its upstream's outlier detector says
    /// (`EndpointStatus`; `GET /explain` on a running gateway, while `portico explain` starts afresh):
    /// an upstream with several endpoints, a breaker, health checks or `dns_refresh` only.
    public var endpointStatus: [EndpointReading]?
    /// The upstream's `provider_limits`, in a sentence: what is spent before forwarding.
    public var providerLimits: String?
    public var deadlines: Deadlines?

    /// One endpoint and its `EndpointStatus`.
    public struct EndpointReading: Sendable, Encodable, Equatable {
        public var address: String
        /// The status's word (`up`, `failing`, `ejected`, `probation`, `unhealthy`).
        public var status: String
        /// While ejected: the failure kind that ejected it.
        public var reason: String?
    }

    enum CodingKeys: String, CodingKey {
        case asked, candidates, outcome, chain, endpoint, deadlines, balance
        case endpointStatus = "endpoint_status"
        case providerLimits = "provider_limits"
        case upstreamURL = "upstream_url"
        case upstreamEndpoints = "upstream_endpoints"
    }
}

/// Why a request could not be explained.
public enum ExplainError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Not `http://host/path`, `https://…` or `/path`.
    case invalidURL(String)
    /// Not `Name: value`.
    case invalidHeader(String)
    /// The gateway would refuse the request before routing (400): the reason.
    case refused(String)

    public var description: String {
        switch self {
        case .invalidURL(let url): "\"\(url)\" is not a URL: give http://host/path, https://host/path or /path"
        case .invalidHeader(let header): "\"\(header)\" is not a header: give 'Name: value'"
        case .refused(let reason): "the gateway would answer 400 bad_request before routing: \(reason)"
        }
    }
}

extension Explanation {
    /// Header values never shown: they carry credentials.
    static let redactedHeaders: Set<String> = ["authorization", "proxy-authorization", "cookie"]

    /// Explains `method url` with `headers` against `runtime`, the way the gateway would route it.
    /// `url` is absolute (its authority is the `Host`, unless a `Host` header is given) or a
    /// target starting with `/` (`Host: localhost` unless given); `client` is the peer address
    /// a `client_ip` key would see.
    public init(method: String, url: String, headers: [String] = [], client: String = "127.0.0.1",
                runtime: GatewayRuntime) throws(ExplainError) {
        var fields: [(name: String, value: String)] = []
        for header in headers {
            guard let colon = header.firstIndex(of: ":"), colon != header.startIndex else { throw .invalidHeader(header) }
            fields.append((String(header[..<colon]).trimmingCharacters(in: .whitespaces),
                           String(header[header.index(after: colon)...]).trimmingCharacters(in: .whitespaces)))
        }
        let (authority, target) = try Self.split(url)
        if !fields.contains(where: { $0.name.lowercased() == "host" }) {
            fields.insert(("Host", authority ?? "localhost"), at: 0)
        }
        let serverRequest = ServerRequest(method: method.uppercased(), target: target, headers: fields, clientAddress: client)
        let request: GatewayRequest
        do {
            request = try GatewayRequest(validating: serverRequest)
        } catch {
            throw .refused(error.message)
        }
        self.init(request: request, runtime: runtime)
    }

    /// `http://host:8080/a?b` → (`host:8080`, `/a?b`); `/a` → (nil, `/a`).
    static func split(_ url: String) throws(ExplainError) -> (authority: String?, target: String) {
        if url.hasPrefix("/") { return (nil, url) }
        let lower = url.lowercased()
        guard lower.hasPrefix("http://") || lower.hasPrefix("https://"), let schemeEnd = url.range(of: "://") else {
            throw .invalidURL(url)
        }
        let rest = url[schemeEnd.upperBound...]
        let end = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        let authority = String(rest[..<end])
        guard !authority.isEmpty else { throw .invalidURL(url) }
        let tail = rest[end...]
        return (authority, tail.isEmpty ? "/" : tail.hasPrefix("?") ? "/" + tail : String(tail))
    }

    init(request: GatewayRequest, runtime: GatewayRuntime) {
        let config = runtime.config
        asked = Asked(method: request.method.rawValue, host: request.head.authority, target: request.target,
                      headers: request.headerFields.map { field in
                          let name = field.name.rawName
                          return Self.redactedHeaders.contains(name.lowercased()) ? "\(name): [REDACTED]" : "\(name): \(field.value)"
                      })
        let match = runtime.router.match(method: request.method, host: request.head.authority, path: request.path)
        let chosen: Route? = if case .route(let route) = match { route } else { nil }
        candidates = Self.candidates(runtime.router.routes, configs: config.routes, request: request, chosen: chosen?.name)
        switch match {
        case .route(let route): outcome = .route(route.name)
        case .notFound: outcome = .notFound
        case .methodNotAllowed(let allow): outcome = .methodNotAllowed(allow: allow)
        }
        guard let chosen, let routeConfig = config.routes.first(where: { $0.name == chosen.name }) else {
            chain = []
            return
        }
        let total = routeConfig.timeout ?? config.listen.requestTimeout
        let context = RequestContext(requestID: "explain", route: chosen.name, upstream: chosen.upstream,
                                     deadline: .now.advanced(by: total), logger: Logger(label: "portico.explain"),
                                     clock: SystemClock())
        chain = RouteTable.chain(of: routeConfig, in: runtime, for: ExplainedRequest(request: request, context: context))
        endpoint = RouteTable.endpoint(of: routeConfig, in: config)
        let totalFrom = routeConfig.timeout == nil ? "listen.request_timeout" : "routes[\(chosen.name)].timeout"
        guard let upstream = chosen.upstream.flatMap({ config.upstreams[$0] }) else {
            deadlines = Deadlines(totalSeconds: total.secondsValue, totalFrom: totalFrom)
            return
        }
        upstreamURL = UpstreamTarget(baseURL: upstream.url).urlString(for: chosen.upstreamTarget(for: request.target))
        upstreamEndpoints = upstream.endpoints.map { UpstreamTarget(baseURL: $0).authority }
        balance = upstream.balance.rawValue
        if let balanced = runtime.upstreams[upstream.name] as? BalancedUpstream {
            endpointStatus = balanced.statuses.map { endpoint, status in
                var reason: String?
                if case .ejected(_, let why) = status { reason = why.name }
                return EndpointReading(address: endpoint.address, status: status.name, reason: reason)
            }
        }
        providerLimits = upstream.providerLimits.map(Self.describe)
        // One attempt is bounded by the upstream's timeout, a retry's per_try_timeout, and what is left of the total.
        var perTry = (upstream.timeout, "upstreams.\(upstream.name).timeout")
        for step in chain where step.type == "retry" {
            if let limit = config.middleware[step.name]?.settings(as: RetryConfig.self)?.perTryTimeout, limit < perTry.0 {
                perTry = (limit, "middleware.\(step.name).per_try_timeout")
            }
        }
        if total < perTry.0 { perTry = (total, totalFrom) }
        deadlines = Deadlines(totalSeconds: total.secondsValue, totalFrom: totalFrom,
                              perTrySeconds: perTry.0.secondsValue, perTryFrom: perTry.1)
    }

    /// What `provider_limits` does before each attempt goes to the upstream.
    static func describe(_ limits: ProviderLimitsConfig) -> String {
        let scope = switch limits.scope {
        case .upstream: "one budget for the whole upstream"
        case .route: "one budget per route"
        case .header(let name): "one budget per value of header \(name)"
        }
        let exhausted = switch limits.whenExhausted {
        case .wait: "waits for the provider's reset up to \(limits.maxWait.configText) (and its deadline), else 429 at once"
        case .reject: "gets 429 at once"
        }
        let store = limits.store.map { ", shared through stores.\($0)" } ?? ""
        return "spends the provider's learned budget before forwarding (scope \(limits.scope), \(scope)\(store)); "
            + "when it is spent or the provider asked for a pause, the request \(exhausted) (when_exhausted: \(limits.whenExhausted.rawValue))"
    }

    /// Every route with its verdict, most specific first (host, exact path, longer prefix), the
    /// order in which the router prefers them.
    static func candidates(_ routes: [Route], configs: [RouteConfig], request: GatewayRequest,
                           chosen: String?) -> [Candidate] {
        let hostname = request.head.authority.map(Route.Matcher.hostname(of:))
        let ordered = routes.enumerated().sorted { a, b in
            let (ra, rb) = (staticRank(a.element.matcher), staticRank(b.element.matcher))
            return ra != rb ? ra > rb : a.offset < b.offset
        }.map(\.element)
        return ordered.map { route in
            let verdict = self.verdict(route.matcher, name: route.name, host: hostname, request: request, chosen: chosen)
            let match = configs.first { $0.name == route.name }.map { RouteTable.Match($0.match).text } ?? ""
            return Candidate(route: route.name, match: match, verdict: verdict, reason: verdict.description)
        }
    }

    private static func staticRank(_ matcher: Route.Matcher) -> Route.Matcher.Rank {
        Route.Matcher.Rank(hostSpecific: matcher.host != nil, exactPath: matcher.path != nil,
                           prefixLength: matcher.pathPrefix?.utf8.count ?? 0)
    }

    private static func verdict(_ matcher: Route.Matcher, name: String, host: String?, request: GatewayRequest,
                                chosen: String?) -> Verdict {
        if let pattern = matcher.host {
            guard let host, Route.Matcher.hostMatches(pattern: pattern, host: host) else {
                return .hostMismatch(pattern: pattern, host: host)
            }
        }
        if let path = matcher.path, !request.path.utf8.elementsEqual(path.utf8) { return .pathMismatch(path: path) }
        if let prefix = matcher.pathPrefix, !Route.Matcher.prefixMatches(prefix: prefix, path: request.path) {
            return .prefixMismatch(prefix: prefix)
        }
        guard matcher.allows(request.method) else {
            return .methodNotAllowed(method: request.method.rawValue, allowed: matcher.methods.sorted())
        }
        if name == chosen { return .chosen }
        return .outranked(by: chosen ?? "?")
    }
}

extension Explanation {
    /// The plain-text rendering `portico explain` prints.
    public var text: String {
        var lines = ["\(asked.method) \(asked.target)" + (asked.host.map { " (Host: \($0))" } ?? "")]
        lines.append("")
        lines.append("Routing: \(outcome)")
        let chosenIndex = candidates.firstIndex { $0.verdict == .chosen } ?? candidates.endIndex
        for candidate in candidates[..<chosenIndex] {
            lines.append("  ✗ \(candidate.route) (\(candidate.match)): \(candidate.reason)")
        }
        if chosenIndex < candidates.endIndex {
            let chosen = candidates[chosenIndex]
            lines.append("  ✓ \(chosen.route) (\(chosen.match))")
            let rest = candidates.count - chosenIndex - 1
            if rest > 0 { lines.append("  (\(rest) less specific route\(rest == 1 ? "" : "s") not considered)") }
        }
        guard case .route = outcome else { return lines.joined(separator: "\n") + "\n" }
        lines.append("")
        lines.append(chain.isEmpty ? "Chain: none" : "Chain, outermost first:")
        for (index, step) in chain.enumerated() {
            lines.append("  \(index + 1). \(step.name) (\(step.type)): \(step.description.action ?? step.description.settings)")
            if let atOnce = step.description.answersAtOnce { lines.append("     may answer at once: \(atOnce)") }
        }
        lines.append("")
        if let endpoint {
            if endpoint.kind == "direct" {
                lines.append("Endpoint: direct response \(endpoint.status ?? 200)")
            } else {
                lines.append("Upstream: \(endpoint.upstream ?? "?") over \(endpoint.transport ?? "?")")
                if let upstreamURL { lines.append("  \(asked.method) \(upstreamURL)") }
                if let upstreamEndpoints, upstreamEndpoints.count > 1 {
                    lines.append("  endpoints (\(balance ?? "round_robin")): \(upstreamEndpoints.joined(separator: ", "))")
                }
                for reading in endpointStatus ?? [] where reading.status != EndpointStatus.up.name {
                    lines.append("  \(reading.address): \(reading.status)" + (reading.reason.map { " (\($0))" } ?? ""))
                }
                if let providerLimits { lines.append("  provider limits: \(providerLimits)") }
            }
        }
        if let deadlines {
            lines.append("Deadlines: total \(Duration.seconds(deadlines.totalSeconds).configText) (\(deadlines.totalFrom))")
            if let perTry = deadlines.perTrySeconds, let from = deadlines.perTryFrom {
                lines.append("  per try \(Duration.seconds(perTry).configText) (\(from))")
            }
        }
        return lines.joined(separator: "\n") + "\n"
    }
}

extension Explanation {
    /// The JSON rendering `GET /explain` answers.
    public var json: [UInt8] { AdminJSON.encode(self) }
}
