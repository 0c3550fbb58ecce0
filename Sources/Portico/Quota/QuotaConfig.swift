import Foundation

/// `type: quota` — a count of requests per calendar window (hour, day or month), kept in a shared
/// store so it survives restarts and holds across replicas, split between keys by `allocations`.
///
/// `limit` is the whole quota. A listed key gets its percentage of it; every key not listed (and
/// every request without the key) draws from one pool shared by all of them: what the listed
/// ones leave, or `default:`'s percentage when given (`default: 0%` refuses them). Without
/// `allocations` the pool is the whole limit.
public struct QuotaConfig: Sendable, Equatable {
    /// The calendar window counted in.
    public enum Period: String, Sendable, Equatable, CaseIterable {
        case hour, day, month
    }

    /// What a request gets when the store fails or is slower than its `timeout`.
    public enum StoreErrorPolicy: String, Sendable, Equatable, CaseIterable {
        /// Go on counting in this process from the last count the store gave, and add what was
        /// served meanwhile to the shared count when the store answers again. During an outage
        /// each replica counts alone, so the fleet may overshoot by what the others serve.
        case local
        /// Let every request through uncounted.
        case allow
        /// Refuse every request with 429 `quota_exhausted` (`Retry-After: 1`).
        case deny
    }

    /// One `allocations:` entry other than `default`.
    public struct Allocation: Sendable, Equatable {
        /// The key's value it applies to (`team-a`); with a list key, the values joined by `+`.
        public var key: String
        /// 0...1 of `limit`.
        public var share: Double

        public init(key: String, share: Double) {
            self.key = key
            self.share = share
        }
    }

    /// The allocation name of the pool unlisted keys share: a reserved word in `allocations`.
    public static let defaultAllocation = "default"
    /// Allocation keys longer than this never match: such key values are shortened to a hash
    /// (`RateLimitMiddleware.maxKeyBytes`).
    public static let maxAllocationKeyBytes = 128

    /// What picks the allocation; empty: every request draws from the pool.
    public var key: [RateLimitConfig.KeyPart] = []
    /// Requests per window, all allocations together.
    public var limit: Int
    public var per: Period
    /// The zone whose calendar the windows follow; UTC by default.
    public var timeZone: TimeZone = CalendarWindows.utc.timeZone
    /// In file order.
    public var allocations: [Allocation] = []
    /// `allocations.default`: the pool's share; `nil` is what the listed allocations leave.
    public var defaultShare: Double?
    /// `stores.NAME` holding the counts.
    public var store: String
    public var onStoreError: StoreErrorPolicy = .local
    /// Whether responses carry `RateLimit-Policy` and `RateLimit`.
    public var headers: Bool = true

    public init(limit: Int, per: Period, store: String) {
        self.limit = limit
        self.per = per
        self.store = store
    }

    /// `share` of `limit`, rounded down (so allocations never add up to more than the limit).
    /// Products a hair from a whole number are that number: 29% of 100 is 28.999999999999996.
    public static func share(_ share: Double, of limit: Int) -> Int {
        let exact = Double(limit) * share
        let nearest = exact.rounded()
        if abs(exact - nearest) <= max(1e-6, exact * 1e-12) { return Int(nearest) }
        return Int(exact.rounded(.down))
    }
}
