/// `type: cache`. A reload with unchanged settings keeps the stored responses (and the
/// metrics handles), so it does not send every request upstream at once.
struct CacheKind: MiddlewareKind {
    let typeName = "cache"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> CacheConfig? {
        CacheConfig.parse(section)
    }

    func make(name: String, settings: CacheConfig, previous: CacheMiddleware?,
              context: MiddlewareBuildContext) -> CacheMiddleware {
        CacheMiddleware(name: name, settings, store: previous?.store, metrics: previous?.metrics)
    }
}

extension MiddlewareConfig {
    /// `type: cache`
    public static func cache(_ settings: CacheConfig) -> MiddlewareConfig {
        MiddlewareConfig(CacheKind(), settings)
    }
}
