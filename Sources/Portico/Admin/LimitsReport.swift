import Foundation

/// `GET /limits`: every limit the gateway applies and where it stands now — each `rate_limit`
/// (its settings and the requests waiting for a token), each upstream's learned provider budgets
/// (`provider_limits`, a header scope shown only as its hash) and each `quota` (its window and,
/// per allocation, the count as this process last saw it).
public struct LimitsReport: Sendable, Encodable {
    public struct RateLimit: Sendable, Encodable {
        public var name: String
        /// As written in the configuration: `10/s`.
        public var rate: String
        public var burst: Int
        public var onLimit: String
        /// `on_limit: wait` only.
        public var maxWaitSeconds: Double?
        public var maxWaiting: Int?
        /// Requests waiting for their token now.
        public var waiting: Int
        /// `stores.NAME`, or `local` for this process's own buckets.
        public var store: String

        enum CodingKeys: String, CodingKey {
            case name, rate, burst, waiting, store
            case onLimit = "on_limit"
            case maxWaitSeconds = "max_wait_seconds"
            case maxWaiting = "max_waiting"
        }
    }

    public struct ProviderLimits: Sendable, Encodable {
        public var upstream: String
        /// `upstream`, `route` or `header:NAME`.
        public var scope: String
        public var whenExhausted: String
        public var maxWaitSeconds: Double
        /// `stores.NAME`, or `local`.
        public var store: String
        public var scopes: [ProviderScopeReport]

        enum CodingKeys: String, CodingKey {
            case upstream, scope, store, scopes
            case whenExhausted = "when_exhausted"
            case maxWaitSeconds = "max_wait_seconds"
        }
    }

    public struct Quota: Sendable, Encodable {
        public var name: String
        /// Requests per window, all allocations together.
        public var limit: Int
        /// `hour`, `day` or `month`.
        public var per: String
        /// RFC 3339, UTC.
        public var windowStart: String
        public var windowEnd: String
        public var store: String
        public var allocations: [Allocation]

        enum CodingKeys: String, CodingKey {
            case name, limit, per, store, allocations
            case windowStart = "window_start"
            case windowEnd = "window_end"
        }
    }

    public struct Allocation: Sendable, Encodable, Equatable {
        /// The allocation's key from the configuration, or `default` for the pool.
        public var name: String
        public var limit: Int
        /// Counted in the current window as this process last saw it (other replicas count too).
        public var used: Int
        public var left: Int
    }

    public var rateLimits: [RateLimit]
    public var providerLimits: [ProviderLimits]
    public var quotas: [Quota]

    enum CodingKeys: String, CodingKey {
        case quotas
        case rateLimits = "rate_limits"
        case providerLimits = "provider_limits"
    }

    public init(_ runtime: GatewayRuntime, now: Date) {
        let names = runtime.middleware.keys.sorted()
        rateLimits = names.compactMap { name in
            guard let limiter = runtime.middleware[name] as? RateLimitMiddleware else { return nil }
            let config = limiter.config
            let waits = config.onLimit == .wait
            return RateLimit(name: name, rate: config.rateText, burst: config.burst, onLimit: config.onLimit.rawValue,
                             maxWaitSeconds: waits ? config.maxWait.secondsValue : nil,
                             maxWaiting: waits ? config.maxWaiting : nil,
                             waiting: limiter.queue.count, store: config.store ?? "local")
        }
        providerLimits = runtime.providerLimiters.keys.sorted().compactMap { upstream in
            guard let limiter = runtime.providerLimiters[upstream] else { return nil }
            let config = limiter.config
            return ProviderLimits(upstream: upstream, scope: config.scope.description,
                                  whenExhausted: config.whenExhausted.rawValue, maxWaitSeconds: config.maxWait.secondsValue,
                                  store: config.store ?? "local", scopes: limiter.report())
        }
        quotas = names.compactMap { name in
            guard let quota = runtime.middleware[name] as? QuotaMiddleware else { return nil }
            let window = quota.windows.window(containing: now)
            return Quota(name: name, limit: quota.config.limit, per: quota.config.per.rawValue,
                         windowStart: CalendarWindow.iso8601(window.start), windowEnd: CalendarWindow.iso8601(window.end),
                         store: quota.config.store,
                         allocations: quota.lastSeen(in: window).map {
                             Allocation(name: $0.allocation.name, limit: $0.allocation.limit, used: $0.used,
                                        left: max(0, $0.allocation.limit - $0.used))
                         })
        }
    }
}
