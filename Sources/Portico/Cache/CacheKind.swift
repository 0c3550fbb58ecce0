/// `type: cache`. A reload with unchanged settings keeps the stored responses (and the
/// metrics handles), so it does not send every request upstream at once.
struct CacheKind: MiddlewareKind {
    let typeName = "cache"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> CacheConfig? {
        CacheConfig.parse(section, names: names)
    }

    func make(name: String, settings: CacheConfig, previous: CacheMiddleware?,
              context: MiddlewareBuildContext) throws -> CacheMiddleware {
        let old = previous?.store as? TieredCacheStore
        guard let storeName = settings.store else {
            return CacheMiddleware(name: name, settings, store: old?.memory ?? previous?.store, metrics: previous?.metrics)
        }
        guard let backend = context.stores.backend(named: storeName) else {
            throw GatewayRuntime.BuildError(description: "middleware \(name): unknown store \"\(storeName)\"")
        }
        let metrics = previous?.metrics ?? CacheMetrics(cache: name)
        // The same client (an unchanged store): keep both tiers; another one: keep the memory.
        let store: TieredCacheStore
        if let old, old.fleet.backend === backend {
            store = old
        } else {
            let memory = old?.memory ?? (previous?.store as? InMemoryCacheStore) ?? InMemoryCacheStore(maxBytes: settings.maxBytes)
            let fleet = SharedCacheTier(cache: name, backend: backend, maxEntryBytes: settings.maxEntryBytes,
                                        peerWait: settings.storeWait,
                                        defaultStaleWindow: max(settings.staleWhileRevalidate, settings.staleIfError),
                                        logger: context.logger)
            store = TieredCacheStore(memory: memory, fleet: fleet, clock: context.clock)
        }
        let feed = CacheInvalidationFeed(tier: store.fleet, memory: store.memory, metrics: metrics, logger: context.logger)
        return CacheMiddleware(name: name, settings, store: store, metrics: metrics, feed: feed)
    }
}

extension MiddlewareConfig {
    /// `type: cache`
    public static func cache(_ settings: CacheConfig) -> MiddlewareConfig {
        MiddlewareConfig(CacheKind(), settings)
    }
}
