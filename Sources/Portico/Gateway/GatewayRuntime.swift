import Logging
import Synchronization

/// Everything built from one configuration: upstream clients, middleware instances, routes.
/// Immutable; a reload builds a new one and the gateway swaps it in.
public final class GatewayRuntime: Sendable {
    public let config: PorticoConfig
    public let router: Router
    public let upstreams: [String: any UpstreamClient]
    /// One provider per credential; a reload hands unchanged ones (and their tokens) over.
    public let credentials: CredentialStore
    /// One client per `stores.NAME`; a reload hands unchanged ones (and their connections) over.
    public let stores: RateLimitStores
    /// Every `middleware.NAME` instance, by name; a reload hands each to its successor when
    /// the settings did not change, so state (stored responses, buckets, budgets) carries over.
    public let middleware: [String: any Middleware]
    /// Each upstream's learned provider limits (`provider_limits`); a reload hands unchanged ones over.
    public let providerLimiters: [String: ProviderLimiter]
    /// Caches, whose background refreshes end with the runtime.
    public let caches: [CacheMiddleware]
    /// The first `access_log` in `defaults.middleware`: it logs the requests answered before
    /// any route matched (malformed, no route, method not allowed, the listener's in-flight cap).
    public let unroutedAccessLog: AccessLogMiddleware?
    /// `tracing:` at work (spans, exporter); `nil` when not configured. Each runtime has its own:
    /// a reload applies a changed `tracing:`, and the old one flushes when its runtime shuts down.
    public let tracing: TracingPipeline?
    /// The loops its `nio` upstreams keep a connection pool on each of (the gateway's; `shared`
    /// for a runtime made on its own).
    public let loops: EventLoops
    /// Upstreams whose clients a successor took over (unchanged at a reload): not shut down with
    /// this runtime, so their pools, endpoint records and exchanges in flight carry on.
    private let handedOver = Mutex<Set<String>>([])

    /// A configuration the loader accepted can still fail here (e.g. a credential file vanished).
    public struct BuildError: Error, CustomStringConvertible {
        public var description: String
    }

    /// `previous`: the runtime being replaced, whose unchanged credentials keep their tokens and
    /// unchanged middleware their state (cached responses, rate-limit buckets, retry budgets).
    public convenience init(config: PorticoConfig, logger: Logger, clock: any GatewayClock = SystemClock(),
                            loops: EventLoops = .shared, previous: GatewayRuntime? = nil) throws {
        // Stores first: credentials with `store:` share their token there.
        let stores = try RateLimitStores(stores: config.stores, previous: previous?.stores, loops: loops, logger: logger)
        var credentials: CredentialStore?
        do {
            credentials = try CredentialStore(config: config, previous: previous?.credentials, stores: stores, logger: logger,
                                              clock: clock)
            try self.init(config: config, logger: logger, clock: clock, loops: loops, credentials: credentials!,
                          stores: stores, previous: previous)
        } catch {
            credentials?.discard()
            stores.discard()
            throw error
        }
    }

    private init(config: PorticoConfig, logger: Logger, clock: any GatewayClock, loops: EventLoops,
                 credentials: CredentialStore, stores: RateLimitStores, previous: GatewayRuntime?) throws {
        self.loops = loops
        for warning in config.warnings {
            logger.warning("configuration: \(warning.description)")
        }
        self.config = config
        self.credentials = credentials
        self.stores = stores
        // Everything that can fail comes first: upstream clients own connection pools that must
        // be shut down, so they are only made once nothing else can throw.
        var context = MiddlewareBuildContext(logger: logger, clock: clock, credentials: credentials)
        context.stores = stores
        var middleware: [String: any Middleware] = [:]
        for (name, settings) in config.middleware {
            let unchanged = previous.flatMap { $0.config.middleware[name] == settings ? $0.middleware[name] : nil }
            middleware[name] = try settings.makeMiddleware(name: name, previous: unchanged, context: context)
        }
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

        let tracing = try config.tracing.map { try TracingPipeline(config: $0, logger: logger) }
        var upstreams: [String: any UpstreamClient] = [:]
        var upstreamMetrics: [String: UpstreamMetrics] = [:]
        for (name, var upstream) in config.upstreams {
            // What `urlsession` reads whole of a streamed upload (it cannot stream one): the
            // listener's limit, and never more than 64 MiB held per request.
            upstream.maxRequestBodyBytes = min(config.listen.maxBodyBytes, UpstreamConfig.maxBufferedUpload)
            let predecessor = previous.flatMap { $0.loops === loops ? $0.upstreams[name] : nil }
            if let predecessor, predecessor.config == upstream {
                // Unchanged: the same client serves on (issue #34: health, ejections, pools survive).
                upstreams[name] = predecessor
                previous?.handedOver.withLock { _ = $0.insert(name) }
            } else {
                // Changed: a new client, which takes over the records and clients of unchanged endpoints.
                upstreams[name] = makeUpstreamClient(upstream, logger: logger, loops: loops, clock: clock,
                                                     previous: predecessor)
            }
            upstreamMetrics[name] = UpstreamMetrics(upstream: name, mayUseHTTP2: upstream.httpProtocol != .http1)
        }
        var providerLimiters: [String: ProviderLimiter] = [:]
        for (name, upstream) in config.upstreams {
            guard let limits = upstream.providerLimits else { continue }
            let fleet = try limits.store.map { storeName in
                guard let backend = stores.backend(named: storeName) else {
                    throw BuildError(description: "upstream \(name): provider_limits.store: unknown store \"\(storeName)\"")
                }
                return RedisProviderBudgets(backend: backend, upstream: name)
            }
            if let old = previous?.providerLimiters[name], old.config == limits, old.fleet?.backend === fleet?.backend {
                providerLimiters[name] = old   // what was learned, and who waits, carry over
            } else {
                providerLimiters[name] = ProviderLimiter(upstream: name, config: limits, clock: clock, fleet: fleet)
            }
        }
        var routes: [Route] = []
        for (route, chain) in zip(config.routes, chains) {
            let matcher = Route.Matcher(path: route.match.path, pathPrefix: route.match.pathPrefix,
                                        host: route.match.host, methods: route.match.methods)
            let endpoint: any Responder
            if let direct = route.direct {
                endpoint = DirectResponder(status: direct.status, headers: direct.headers, body: direct.body)
            } else if let name = route.upstream, let client = upstreams[name] {
                let forwarding = UpstreamEndpoint(client: client, metrics: upstreamMetrics[name]).traced(by: tracing, upstream: client.config)
                endpoint = providerLimiters[name].map { ProviderPacedResponder(limiter: $0, endpoint: forwarding) } ?? forwarding
            } else {
                // Checked above, before any upstream client existed: unreachable.
                preconditionFailure("route \(route.name): no upstream or direct response")
            }
            let stripping: any Responder = if route.stripPrefix, let prefix = route.match.pathPrefix {
                PrefixStripping(prefix: prefix, endpoint: endpoint)
            } else {
                endpoint
            }
            let built = Route(name: route.name, matcher: matcher, stripPrefix: route.stripPrefix,
                              upstream: route.upstream, timeout: route.timeout,
                              streamIdleTimeout: route.streamIdleTimeout, maxStreamDuration: route.maxStreamDuration,
                              inFlight: route.maxInFlight.map { InFlightLimit(limit: $0, name: "routes.\(route.name).max_in_flight") },
                              maxRequestBodyBytes: route.upstream.flatMap { upstreams[$0] }
                                  .flatMap { $0.config.transport == .urlsession ? $0.config.maxRequestBodyBytes : nil },
                              responder: MiddlewareChain(chain, endpoint: stripping).traced(by: tracing, route: route),
                              accessLog: chain.lazy.compactMap { $0 as? AccessLogMiddleware }.first,
                              upgrade: Set(route.upgrade), websocketIdleTimeout: route.websocketIdleTimeout)
            routes.append(built)
        }
        self.router = Router(routes: routes)
        self.unroutedAccessLog = config.defaults.middleware.lazy.compactMap { middleware[$0] as? AccessLogMiddleware }.first
        self.upstreams = upstreams
        self.providerLimiters = providerLimiters
        self.tracing = tracing
        self.middleware = middleware
        self.caches = middleware.values.compactMap { $0 as? CacheMiddleware }
        // Built: nothing can fail any more, so tasks that shutdown() stops may start.
        for cache in caches { cache.start() }
    }

    /// Releases upstream connections. Called once no request uses this runtime.
    public func shutdown() async {
        await release { await $0.shutdown() }
    }

    /// A reload replaced this runtime and its requests have had their request timeout: releases
    /// everything but the upstream exchanges still in flight — response streams, which finish
    /// on their own terms (`stream_idle_timeout`, `max_stream_duration`), then close.
    public func retire() async {
        await release { await $0.retire() }
    }

    private func release(upstreams releasing: (any UpstreamClient) async -> Void) async {
        for cache in caches {
            await cache.shutdown()
        }
        let kept = handedOver.withLock { $0 }
        for (name, client) in upstreams where !kept.contains(name) {
            await releasing(client)
        }
        await credentials.shutdown()
        await tracing?.shutdown()
        await stores.shutdown()
    }
}
