import Foundation
import HTTPTypes
import Metrics

/// Counts requests against a quota per calendar window (`QuotaConfig`), in a shared store.
/// A request whose allocation is spent gets 429 `quota_exhausted` with `Retry-After` at the
/// window's end; every response (errors included) carries `RateLimit-Policy` (the allocation
/// over the window's length) and `RateLimit` (what remains, seconds to the reset) unless
/// `headers: false`. Like `rate_limit`, place it outside caching and retries, so a request is
/// counted once however it is served.
public struct QuotaMiddleware: Middleware {
    /// The middleware instance's name: the policy name in the headers, its part of the store's keys.
    public let name: String
    public let config: QuotaConfig
    public let store: any QuotaStore
    public let allocations: QuotaAllocations
    public let windows: CalendarWindows
    /// `portico_quota_used{middleware,allocation}`, one per allocation: the count in the current
    /// window as this replica last saw it.
    private let usedGauges: [Gauge]

    /// `portico_quota_rejected_total{middleware,allocation}`: the allocation is a name from the
    /// configuration (or `default`), never a request's key value.
    static let rejected = LabelledCounters("portico_quota_rejected_total")

    public init(name: String, _ config: QuotaConfig, store: (any QuotaStore)? = nil) {
        self.name = name
        self.config = config
        let allocations = QuotaAllocations(config)
        self.allocations = allocations
        self.store = store ?? LocalQuotaCounts(allocations: allocations.all.count)
        self.windows = CalendarWindows(period: config.per, timeZone: config.timeZone)
        self.usedGauges = allocations.all.map { allocation in
            let dimensions = [("middleware", name), ("allocation", allocation.name)]
            Gauge(label: "portico_quota_limit", dimensions: dimensions).record(allocation.limit)
            return Gauge(label: "portico_quota_used", dimensions: dimensions)
        }
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        let now = context.clock.wallNow
        let window = windows.window(containing: now)
        let allocation = allocation(for: request, route: context.route)
        let decision: QuotaDecision
        if allocation.limit == 0 {
            // `default: 0%` (or an allocation of 0): refused without asking the store.
            decision = QuotaDecision(allowed: false, limit: 0, used: 0)
        } else {
            decision = await store.charge(allocation, in: window, at: now)
            usedGauges[allocation.index].record(decision.used)
        }
        let remaining = window.remaining(at: now)
        guard decision.allowed else {
            throw refusal(decision, allocation: allocation, window: window, remaining: remaining, route: context.route)
        }
        do {
            var response = try await next(request, context)
            addHeaders(to: &response.headerFields, decision, window: window, remaining: remaining)
            return response
        } catch var error as GatewayError {
            addHeaders(to: &error.headerFields, decision, window: window, remaining: remaining)
            throw error
        }
    }

    /// The allocation the request draws from: its key's value when listed, else the pool.
    func allocation(for request: GatewayRequest, route: String?) -> QuotaAllocation {
        guard !config.key.isEmpty, allocations.all.count > 1 else { return allocations.pool }
        guard var key = RateLimitMiddleware.key(for: request, parts: config.key, route: route, stableHash: true) else {
            return allocations.pool
        }
        if config.key.count > 1 { key = key.replacingOccurrences(of: "\u{0}", with: "+") }
        return allocations.allocation(forKey: key)
    }

    private func refusal(_ decision: QuotaDecision, allocation: QuotaAllocation, window: CalendarWindow,
                         remaining: Duration, route: String?) -> GatewayError {
        Self.rejected.increment([("middleware", name), ("allocation", allocation.name)])
        // Also among the gateway's 429s by reason, beside the rate limiters' own.
        RateLimitMiddleware.rejected.increment([("route", route ?? ""), ("reason", RateLimitRefusal.quota.rawValue)])
        var fields = HTTPFields()
        addHeaders(to: &fields, decision, window: window, remaining: remaining)
        if decision.storeUnavailable {
            return .quotaExhausted("quota \(name) cannot be checked: its store is unavailable; retry later",
                                   retryAfter: .seconds(1), headerFields: fields)
        }
        if allocation.limit == 0 {
            // Waiting would not help: the next window allocates nothing either.
            return .quotaExhausted("quota \(name) allocates nothing to this request (allocation \(allocation.name))",
                                   retryAfter: nil, headerFields: fields)
        }
        return .quotaExhausted("quota \(name) (allocation \(allocation.name), \(allocation.limit) a \(config.per.rawValue)) "
            + "is spent; it resets at \(CalendarWindow.iso8601(window.end))", retryAfter: remaining, headerFields: fields)
    }

    private func addHeaders(to fields: inout HTTPFields, _ decision: QuotaDecision, window: CalendarWindow, remaining: Duration) {
        guard config.headers else { return }
        let policy = RateLimitHeaders.sfString(name) + ";q=\(decision.limit);w=\(max(1, wholeSecondsRoundedUp(window.length)))"
        let state = RateLimitHeaders.sfString(name) + ";r=\(decision.remaining);t=\(wholeSecondsRoundedUp(remaining))"
        RateLimitHeaders.append(policy, to: RateLimitHeaders.policyName, in: &fields)
        RateLimitHeaders.append(state, to: RateLimitHeaders.stateName, in: &fields)
    }

    /// Each allocation with its count in `window` as this process last saw it: the store's last
    /// answer, or what it counted alone while the store was away (`GET /limits`).
    public func lastSeen(in window: CalendarWindow) -> [(allocation: QuotaAllocation, used: Int)] {
        let counts = (store as? LocalQuotaCounts) ?? (store as? RedisQuotaStore)?.local
        return allocations.all.map { allocation in
            (allocation, counts?.used(allocation, in: window) ?? 0)
        }
    }
}
