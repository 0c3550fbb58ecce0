/// `upstreams.NAME.provider_limits` — learn the provider's limits from its own responses and
/// hold back what it would refuse.
public struct ProviderLimitsConfig: Sendable, Equatable {
    /// One learned budget per scope.
    public enum Scope: Sendable, Equatable, CustomStringConvertible {
        /// One budget for the whole upstream.
        case upstream
        /// One per route.
        case route
        /// One per value of a request header (name lower-cased), e.g. the API key the provider counts by.
        case header(String)

        public var description: String {
            switch self {
            case .upstream: "upstream"
            case .route: "route"
            case .header(let name): "header:\(name)"
            }
        }
    }

    /// What a request gets when its scope's budget is spent or the provider asked for a pause.
    public enum WhenExhausted: String, Sendable, Equatable, CaseIterable {
        /// Waits for the provider's reset, when that fits `max_wait` and the request's deadline; 429 at once otherwise.
        case wait
        /// 429 at once.
        case reject
    }

    public var scope: Scope = .upstream
    public var whenExhausted: WhenExhausted = .wait
    public var maxWait: Duration = .seconds(5)
    /// Scopes kept in memory at most; beyond, the idlest are forgotten.
    public var maxScopes: Int = 10_000
    /// A 429 that says nothing of when to come back holds the scope this long.
    public var defaultHold: Duration = .seconds(1)

    public init() {}
}
