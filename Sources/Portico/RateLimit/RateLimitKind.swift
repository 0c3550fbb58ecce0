/// `type: rate_limit`. A reload with unchanged settings keeps the buckets: a client that
/// spent its burst does not get a new one because the file was re-read. Changed settings
/// start with full buckets.
struct RateLimitKind: MiddlewareKind {
    let typeName = "rate_limit"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> RateLimitConfig? {
        RateLimitConfig.parse(section)
    }

    func make(name: String, settings: RateLimitConfig, previous: RateLimitMiddleware?,
              context: MiddlewareBuildContext) -> RateLimitMiddleware {
        RateLimitMiddleware(name: name, settings, store: previous?.store)
    }
}

extension MiddlewareConfig {
    /// `type: rate_limit`
    public static func rateLimit(_ settings: RateLimitConfig) -> MiddlewareConfig {
        MiddlewareConfig(RateLimitKind(), settings)
    }
}
