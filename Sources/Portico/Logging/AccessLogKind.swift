/// `type: access_log`. Holds no state: a reload builds it anew.
struct AccessLogKind: MiddlewareKind {
    let typeName = "access_log"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> AccessLogConfig? {
        AccessLogConfig.parse(section)
    }

    func make(name: String, settings: AccessLogConfig, previous: AccessLogMiddleware?,
              context: MiddlewareBuildContext) -> AccessLogMiddleware {
        AccessLogMiddleware(settings, logger: context.logger, clock: context.clock)
    }
}

extension MiddlewareConfig {
    /// `type: access_log`
    public static func accessLog(_ settings: AccessLogConfig) -> MiddlewareConfig {
        MiddlewareConfig(AccessLogKind(), settings)
    }
}
