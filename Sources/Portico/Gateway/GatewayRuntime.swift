import Logging

/// Everything built from one configuration: upstream clients, middleware instances, routes.
/// Immutable; a reload builds a new one and the gateway swaps it in.
public final class GatewayRuntime: Sendable {
    public let config: PorticoConfig
    public let router: Router
    public let upstreams: [String: any UpstreamClient]
    /// One provider per credential; a reload hands unchanged ones (and their tokens) over.
    public let credentials: CredentialStore
    /// Caches, whose background refreshes end with the runtime.
    public let caches: [CacheMiddleware]
    /// The first `access_log` in `defaults.middleware`: it logs the requests answered before
    /// any route matched (malformed, no route, method not allowed, the listener's in-flight cap).
    public let unroutedAccessLog: AccessLogMiddleware?

    /// A configuration the loader accepted can still fail here (e.g. a credential file vanished).
    public struct BuildError: Error, CustomStringConvertible {
        public var description: String
    }

    /// `previous`: the runtime being replaced, whose unchanged credentials keep their tokens and
    /// unchanged caches their stored responses.
    public convenience init(config: PorticoConfig, logger: Logger, clock: any GatewayClock = SystemClock(),
                            previous: GatewayRuntime? = nil) throws {
        let credentials = try CredentialStore(config: config, previous: previous?.credentials, logger: logger, clock: clock)
        do {
            try self.init(config: config, logger: logger, clock: clock, credentials: credentials,
                          previousCaches: previous?.caches ?? [])
        } catch {
            credentials.discard()
            throw error
        }
    }

    private init(config: PorticoConfig, logger: Logger, clock: any GatewayClock, credentials: CredentialStore,
                 previousCaches: [CacheMiddleware]) throws {
        for warning in config.warnings {
            logger.warning("configuration: \(warning.description)")
        }
        self.config = config
        self.credentials = credentials
        // Everything that can fail comes first: upstream clients own connection pools that must
        // be shut down, so they are only made once nothing else can throw.
        var middleware: [String: any Middleware] = [:]
        for (name, settings) in config.middleware {
            middleware[name] = try Self.makeMiddleware(name: name, settings, config: config, logger: logger, clock: clock,
                                                       credentials: credentials)
        }
        CacheMiddleware.keepStores(of: previousCaches, in: &middleware)
        var chains: [[any Middleware]] = []
        for route in config.routes {
            let names = route.middleware ?? config.defaults.middleware
            chains.append(try names.map { name in
                guard let instance = middleware[name] else {
                    throw BuildError(description: "route \(route.name): unknown middleware \"\(name)\"")
                }
                return instance
            })
            if route.direct == nil {
                guard let upstream = route.upstream, config.upstreams[upstream] != nil else {
                    throw BuildError(description: "route \(route.name): no upstream or direct response")
                }
            }
        }

        var upstreams: [String: any UpstreamClient] = [:]
        var upstreamMetrics: [String: UpstreamMetrics] = [:]
        for (name, upstream) in config.upstreams {
            upstreams[name] = makeUpstreamClient(upstream, logger: logger)
            upstreamMetrics[name] = UpstreamMetrics(upstream: name)
        }
        var routes: [Route] = []
        for (route, chain) in zip(config.routes, chains) {
            let matcher = Route.Matcher(path: route.match.path, pathPrefix: route.match.pathPrefix,
                                        host: route.match.host, methods: route.match.methods)
            let endpoint: any Responder = if let direct = route.direct {
                DirectResponder(status: direct.status, headers: direct.headers, body: direct.body)
            } else {
                UpstreamEndpoint(client: upstreams[route.upstream!]!, metrics: upstreamMetrics[route.upstream!])
            }
            var built = Route(name: route.name, matcher: matcher, stripPrefix: route.stripPrefix,
                              upstream: route.upstream, timeout: route.timeout,
                              inFlight: route.maxInFlight.map(InFlightLimit.init(limit:)), responder: endpoint)
            built.responder = MiddlewareChain(chain, endpoint: PrefixStripping(route: built, endpoint: endpoint))
            built.accessLog = chain.lazy.compactMap { $0 as? AccessLogMiddleware }.first
            routes.append(built)
        }
        self.router = Router(routes: routes)
        self.unroutedAccessLog = config.defaults.middleware.lazy.compactMap { middleware[$0] as? AccessLogMiddleware }.first
        self.upstreams = upstreams
        self.caches = middleware.values.compactMap { $0 as? CacheMiddleware }
    }

    /// Releases upstream connections. Called once no request uses this runtime.
    public func shutdown() async {
        for cache in caches {
            await cache.shutdown()
        }
        for client in upstreams.values {
            await client.shutdown()
        }
        await credentials.shutdown()
    }

    static func makeMiddleware(name: String, _ settings: MiddlewareConfig, config: PorticoConfig,
                               logger: Logger, clock: any GatewayClock, credentials: CredentialStore) throws -> any Middleware {
        switch settings {
        case .accessLog(let accessLog):
            return AccessLogMiddleware(accessLog, logger: logger, clock: clock)
        case .auth(let auth):
            guard let provider = credentials.provider(named: auth.credential) else {
                throw BuildError(description: "middleware \(name): unknown credential \"\(auth.credential)\"")
            }
            return AuthMiddleware(provider: provider, clientHeader: auth.clientHeader)
        case .retry(let retry):
            return RetryMiddleware(retry)
        case .rateLimit(let rateLimit):
            return RateLimitMiddleware(name: name, rateLimit)
        case .compress(let compress):
            return CompressMiddleware(compress)
        case .cache(let cache):
            return CacheMiddleware(name: name, cache)
        }
    }
}

/// Applies a route's `strip_prefix` just before the endpoint, so middleware see the client's target.
struct PrefixStripping: Responder {
    let route: Route
    let endpoint: any Responder

    func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        try await endpoint.respond(to: stripped(request), context: context)
    }

    func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse? {
        try endpoint.respondImmediately(to: stripped(request), context: context)
    }

    var answersImmediately: Bool { endpoint.answersImmediately }

    private func stripped(_ request: GatewayRequest) -> GatewayRequest {
        guard route.stripPrefix else { return request }
        var stripped = request
        stripped.head.path = route.upstreamTarget(for: request.target)
        return stripped
    }
}
