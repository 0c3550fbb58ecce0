/// `type: rate_limit`. A reload with unchanged settings keeps the buckets: a client that
/// spent its burst does not get a new one because the file was re-read. Changed settings
/// start with full buckets.
struct RateLimitKind: MiddlewareKind {
    let typeName = "rate_limit"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> RateLimitConfig? {
        RateLimitConfig.parse(section, names: names)
    }

    func make(name: String, settings: RateLimitConfig, previous: RateLimitMiddleware?,
              context: MiddlewareBuildContext) throws -> RateLimitMiddleware {
        // Requests waiting on the old instance stay counted against `max_waiting`.
        let queue = previous?.queue
        guard let storeName = settings.store else {
            return RateLimitMiddleware(name: name, settings, store: previous?.store, queue: queue)
        }
        guard let backend = context.stores.backend(named: storeName) else {
            throw GatewayRuntime.BuildError(description: "middleware \(name): unknown store \"\(storeName)\"")
        }
        let old = previous?.store as? SharedRateLimitStore
        // The same client (an unchanged store): keep everything; another one: keep the local buckets.
        if let old, old.backend === backend { return RateLimitMiddleware(name: name, settings, store: old, queue: queue) }
        let policy = TokenBucketPolicy(settings)
        let store = SharedRateLimitStore(backend: backend, namespace: name, policy: policy, onStoreError: settings.onStoreError,
                                         local: old?.local ?? InMemoryRateLimitStore(policy: policy, maxKeys: settings.maxKeys))
        return RateLimitMiddleware(name: name, settings, store: store, queue: queue)
    }
}

extension MiddlewareConfig {
    /// `type: rate_limit`
    public static func rateLimit(_ settings: RateLimitConfig) -> MiddlewareConfig {
        MiddlewareConfig(RateLimitKind(), settings)
    }
}
