import Foundation

/// The answer to one request's charge against its allocation.
public struct QuotaDecision: Sendable, Equatable {
    public var allowed: Bool
    /// The allocation's requests per window.
    public var limit: Int
    /// Counted in this window so far, this request included when allowed.
    public var used: Int
    /// Refused because the store failed and `on_store_error: deny`, not because the quota is spent.
    public var storeUnavailable: Bool

    public init(allowed: Bool, limit: Int, used: Int, storeUnavailable: Bool = false) {
        self.allowed = allowed
        self.limit = limit
        self.used = used
        self.storeUnavailable = storeUnavailable
    }

    /// Requests left in this window.
    public var remaining: Int { max(0, limit - used) }
}

/// Where a quota's counts live. `RedisQuotaStore` (with its fallback) in service; a
/// `LocalQuotaCounts` alone counts in this process only (tests).
public protocol QuotaStore: Sendable {
    /// Counts one request against `allocation` in `window` when it fits; `now` is the gateway's
    /// wall time (how long the window has left). Never throws: a failing store is answered
    /// by its `on_store_error`.
    func charge(_ allocation: QuotaAllocation, in window: CalendarWindow, at now: Date) async -> QuotaDecision
}
