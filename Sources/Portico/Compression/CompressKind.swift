/// `type: compress`. Holds no state: a reload builds it anew.
struct CompressKind: MiddlewareKind {
    let typeName = "compress"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> CompressConfig? {
        CompressConfig.parse(section)
    }

    func make(name: String, settings: CompressConfig, previous: CompressMiddleware?,
              context: MiddlewareBuildContext) -> CompressMiddleware {
        CompressMiddleware(settings)
    }
}

extension MiddlewareConfig {
    /// `type: compress`
    public static func compress(_ settings: CompressConfig) -> MiddlewareConfig {
        MiddlewareConfig(CompressKind(), settings)
    }
}
