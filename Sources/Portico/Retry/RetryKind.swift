/// `type: retry`. A reload with unchanged settings keeps the retry budget and the traffic it
/// has counted, so re-reading the file during an outage does not allow a fresh burst of retries.
struct RetryKind: MiddlewareKind {
    let typeName = "retry"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> RetryConfig? {
        RetryConfig.parse(section)
    }

    func make(name: String, settings: RetryConfig, previous: RetryMiddleware?,
              context: MiddlewareBuildContext) -> RetryMiddleware {
        RetryMiddleware(settings, budget: previous?.budget, latencies: previous?.latencies)
    }
}

extension MiddlewareConfig {
    /// `type: retry`
    public static func retry(_ settings: RetryConfig) -> MiddlewareConfig {
        MiddlewareConfig(RetryKind(), settings)
    }
}
