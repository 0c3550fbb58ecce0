/// `type: headers`. Holds no state: a reload builds it anew.
struct HeadersKind: MiddlewareKind {
    let typeName = "headers"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> HeadersConfig? {
        HeadersConfig.parse(section)
    }

    func make(name: String, settings: HeadersConfig, previous: HeadersMiddleware?,
              context: MiddlewareBuildContext) -> HeadersMiddleware {
        HeadersMiddleware(settings)
    }
}

extension MiddlewareConfig {
    /// `type: headers`
    public static func headers(_ settings: HeadersConfig) -> MiddlewareConfig {
        MiddlewareConfig(HeadersKind(), settings)
    }
}
