/// `type: quota`. The counts live in the store, so any reload keeps them; one with unchanged
/// settings also keeps the store client's local counts (what `on_store_error: local` goes on
/// from, and what was served during an outage and is still to be added to the shared count).
struct QuotaKind: MiddlewareKind {
    let typeName = "quota"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> QuotaConfig? {
        QuotaConfig.parse(section, names: names)
    }

    func make(name: String, settings: QuotaConfig, previous: QuotaMiddleware?,
              context: MiddlewareBuildContext) throws -> QuotaMiddleware {
        guard let backend = context.stores.backend(named: settings.store) else {
            throw GatewayRuntime.BuildError(description: "middleware \(name): unknown store \"\(settings.store)\"")
        }
        let old = previous?.store as? RedisQuotaStore
        if let old, old.backend === backend { return QuotaMiddleware(name: name, settings, store: old) }
        let local = old?.local ?? LocalQuotaCounts(allocations: QuotaAllocations(settings).all.count)
        let store = RedisQuotaStore(backend: backend, namespace: name, onStoreError: settings.onStoreError,
                                    local: local, logger: context.logger)
        return QuotaMiddleware(name: name, settings, store: store)
    }
}

extension MiddlewareConfig {
    /// `type: quota`
    public static func quota(_ settings: QuotaConfig) -> MiddlewareConfig {
        MiddlewareConfig(QuotaKind(), settings)
    }
}
