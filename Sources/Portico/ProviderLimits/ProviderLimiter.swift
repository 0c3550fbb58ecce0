import Foundation
import HTTPTypes
import Metrics
import Synchronization

/// One upstream's learned limits (`provider_limits`): a budget per scope, spent before each
/// attempt is forwarded and corrected by every response the provider sends.
///
/// After a response that says `r` remain until `t`, at most `r` more requests go before `t`,
/// counting those still in flight (they may not be in the provider's count yet): the budget is
/// `r` less what is in flight. A `Retry-After` (or a 429) holds the scope until then: nothing
/// reaches the provider during a hold it announced. When the budget is spent or the scope is
/// held, a request waits for the reset (`when_exhausted: wait`, when the wait fits `max_wait`
/// and its deadline) or is refused at once with 429 `provider_exhausted` and `Retry-After`.
/// After the reset the window's quota (when the provider said it) is the budget until the next
/// response says what holds.
///
/// Shared state: a scope's budget is one number for every core by nature (the provider counts
/// them all), so each scope is a small record under its shard's lock, taken once when an attempt
/// goes and once when its answer comes; requests of other scopes rarely meet it.
public final class ProviderLimiter: Sendable {
    public let upstream: String
    public let config: ProviderLimitsConfig

    enum Admission: Equatable {
        /// It goes, in the provider's window numbered `window`.
        case go(window: Int)
        /// Held (`Retry-After`) or spent with no quota known: ask again then.
        case waitUntil(ContinuousClock.Instant)
        /// A slot in the provider's window numbered `window` is this request's: it is expected
        /// to begin at `at`; the request then claims it (and waits again if it has not begun).
        case reserved(at: ContinuousClock.Instant, window: Int)
    }

    /// The window an attempt went in, numbered by the budget that let it go (the fleet's or this
    /// process's): its answer counts for that window, whenever it comes.
    struct Ticket: Sendable, Equatable {
        let window: Int
        let shared: Bool
    }

    private final class Shard: Sendable {
        let budgets = Mutex<[String: Budget]>([:])
    }

    private let shards: [Shard]
    private let shardCapacity: Int
    private let clock: any GatewayClock
    /// The budgets every replica shares (`store:`); this process's own ones stand in whenever
    /// the store fails or is slower than its `timeout`, and learn from every answer meanwhile.
    let fleet: RedisProviderBudgets?

    /// `portico_provider_limit_waiting{upstream}`, `portico_provider_limit_wait_seconds{upstream}`.
    private let waitingMeter: Meter
    private let waited: Metrics.Timer
    static let throttled = LabelledCounters("portico_provider_throttled_total")
    static let malformed = LabelledCounters("portico_provider_limit_malformed_total")
    static let remainingGauges = LabelledGauges("portico_provider_limit_remaining")

    init(upstream: String, config: ProviderLimitsConfig, clock: any GatewayClock, fleet: RedisProviderBudgets? = nil,
         shards: Int = 16) {
        self.fleet = fleet
        self.upstream = upstream
        self.config = config
        self.clock = clock
        let count = max(1, min(shards, config.maxScopes))
        self.shards = (0..<count).map { _ in Shard() }
        self.shardCapacity = max(1, config.maxScopes / count)
        waitingMeter = Meter(label: "portico_provider_limit_waiting", dimensions: [("upstream", upstream)])
        waited = Metrics.Timer(label: "portico_provider_limit_wait_seconds", dimensions: [("upstream", upstream)])
    }

    /// The scope a request counts against.
    func scope(for request: GatewayRequest, context: RequestContext) -> String {
        switch config.scope {
        case .upstream: ""
        case .route: context.route ?? ""
        case .header(let name):
            RateLimitMiddleware.key(for: request, parts: [.header(name)], route: nil) ?? RateLimitMiddleware.missingKeyBucket
        }
    }

    /// Lets an attempt go, after waiting for the provider's reset when that fits; throws 429
    /// `provider_exhausted` at once when it does not.
    @discardableResult
    func admit(_ scope: String, context: RequestContext) async throws -> Ticket {
        let patience = config.whenExhausted == .wait ? max(.zero, min(config.maxWait, context.remaining)) : .zero
        let start = clock.now
        var (admission, shared) = await decideShared(scope, at: start)
        while true {
            let now = clock.now
            let left = patience - start.duration(to: now)
            switch admission {
            case .go(let window):
                return Ticket(window: window, shared: shared)
            case .waitUntil(let instant):
                let needed = now.duration(to: instant)
                guard needed <= left else { throw refusal(retryAfter: needed, context: context) }
                try await wait(scope, until: instant)
                (admission, shared) = await decideShared(scope, at: clock.now)
            case .reserved(let instant, let window):
                let needed = now.duration(to: instant)
                guard needed <= left else {
                    await releaseShared(scope, window: window)
                    throw refusal(retryAfter: needed, context: context)
                }
                do {
                    try await wait(scope, until: instant)
                } catch {
                    await releaseShared(scope, window: window)
                    throw error
                }
                (admission, shared) = await claimShared(scope, window: window, at: clock.now)
            }
        }
    }

    // The fleet's budgets when there is a store and it answers; this process's own otherwise.

    private func decideShared(_ scope: String, at now: ContinuousClock.Instant) async -> (Admission, shared: Bool) {
        if let fleet, let shared = try? await fleet.decide(scope, defaultHold: config.defaultHold, at: now) { return (shared, true) }
        return (decide(scope, at: now), false)
    }

    private func claimShared(_ scope: String, window: Int, at now: ContinuousClock.Instant) async -> (Admission, shared: Bool) {
        if let fleet, let shared = try? await fleet.claim(scope, window: window, at: now) { return (shared, true) }
        return (claim(scope, window: window, at: now), false)
    }

    private func releaseShared(_ scope: String, window: Int) async {
        if let fleet, (try? await fleet.release(scope, window: window)) != nil { return }
        release(scope, window: window)
    }

    /// A reservation that will not be used: out of the queue, or back to its window's budget
    /// when that window has begun.
    func release(_ scope: String, window: Int) {
        let now = clock.now
        update(scope) { budget in
            budget.roll(at: now)
            if window == budget.windowNumber, budget.due > 0 {
                budget.due -= 1
                budget.remaining = budget.remaining.map { $0 + 1 }
            } else if let count = budget.booked[window] {
                budget.booked[window] = count > 1 ? count - 1 : nil
            }
        }
    }

    /// A reservation's time has come: it goes when its window has begun, unless the provider
    /// asked for a pause meanwhile; a window that has not begun yet (the reset came later than
    /// first announced) is waited for again, the slot still this request's. Under a guessed
    /// budget a window never sends more than the guess: a reservation booked under a higher one
    /// finds its window full and takes the next window's first slots; one late for its window
    /// spends this window's budget like a newcomer.
    func claim(_ scope: String, window: Int, at now: ContinuousClock.Instant) -> Admission {
        update(scope) { budget in
            budget.roll(at: now)
            if window > budget.windowNumber, let start = budget.start(ofWindow: window) {
                return .reserved(at: max(start, now), window: window)
            }
            let due = window == budget.windowNumber && budget.due > 0
            if due { budget.due -= 1 }
            if let hold = budget.hold {
                // Its slot is the window's again, unless the provider refused in it: then none is left.
                if due, budget.refusedWindow != budget.windowNumber { budget.remaining = budget.remaining.map { $0 + 1 } }
                return .waitUntil(hold)
            }
            if budget.limitGuessed, let limit = budget.limit {
                var full = false
                if budget.refusedWindow == budget.windowNumber {
                    full = true   // the provider refused in this window: nothing is left in it
                } else if due {
                    full = budget.sent >= limit
                } else if let remaining = budget.remaining {
                    if remaining > 0 { budget.remaining = remaining - 1 } else { full = true }
                }
                let next = budget.windowNumber + 1
                if full, let start = budget.start(ofWindow: next) {
                    budget.booked[next, default: 0] += 1
                    return .reserved(at: max(start, now), window: next)
                }
            }
            budget.went(at: now)
            return .go(window: budget.windowNumber)
        }
    }

    private func wait(_ scope: String, until instant: ContinuousClock.Instant) async throws {
        update(scope) { $0.waiting += 1 }
        waitingMeter.increment()
        let started = clock.now
        defer {
            update(scope) { $0.waiting -= 1 }
            waitingMeter.decrement()
            waited.recordNanoseconds(GatewayMetrics.nanoseconds(started.duration(to: clock.now)))
        }
        try await LoopTimer.sleep(until: instant, clock: clock)
    }

    private func refusal(retryAfter: Duration, context: RequestContext) -> GatewayError {
        RateLimitMiddleware.rejected.increment([("route", context.route ?? ""), ("reason", "provider_exhausted")])
        context.stats.update { $0.extra.append(("ratelimit", "provider_exhausted")) }
        return GatewayError.providerExhausted(upstream: upstream, retryAfter: retryAfter)
    }

    /// Spends one from the budget, or says until when to wait: with the window's quota known, a
    /// slot in the first window that still has room (first come, first served); else until the
    /// reset.
    func decide(_ scope: String, at now: ContinuousClock.Instant) -> Admission {
        update(scope) { budget in
            budget.roll(at: now)
            budget.lastUsed = now
            if let hold = budget.hold { return .waitUntil(hold) }
            if let remaining = budget.remaining {
                guard remaining > 0 else {
                    if let limit = budget.limit, limit > 0, budget.reset != nil, let window = budget.window, window > .zero {
                        let number = budget.book(limit: limit)
                        return .reserved(at: budget.start(ofWindow: number) ?? now, window: number)
                    }
                    return .waitUntil(budget.reset ?? now.advanced(by: config.defaultHold))
                }
                budget.remaining = remaining - 1
            }
            budget.went(at: now)
            return .go(window: budget.windowNumber)
        }
    }

    /// What the provider's answer to an admitted attempt says: learned here and, with a store,
    /// by the fleet. `ticket` says which window the attempt went in (without one: the current).
    func observe(_ scope: String, ticket: Ticket? = nil, status: Int, fields: HTTPFields) async {
        let observation = ProviderLimitHeaders.observe(fields, status: status, now: clock.wallNow)
        if let fleet {
            try? await fleet.observe(scope, window: ticket?.shared == true ? ticket?.window : nil, status: status, observation,
                                     defaultHold: config.defaultHold)
        }
        for name in observation.malformed {
            Self.malformed.increment([("upstream", upstream), ("header", name)])
        }
        if status == 429 { Self.throttled.increment([("upstream", upstream)]) }
        let now = clock.now
        let left: Int? = update(scope) { budget in
            budget.inFlight = max(0, budget.inFlight - 1)
            budget.roll(at: now)
            // A window the fleet numbered means nothing here: the answer counts for this window.
            Self.learn(observation, status: status, window: ticket?.shared == false ? ticket?.window : nil, into: &budget,
                       at: now, defaultHold: config.defaultHold)
            return budget.remaining
        }
        if let left, config.scope != .header("") {
            switch config.scope {
            case .upstream: Self.remainingGauges.record(Double(left), [("upstream", upstream), ("scope", "upstream")])
            case .route: Self.remainingGauges.record(Double(left), [("upstream", upstream), ("scope", scope)])
            case .header: break  // a header's value (an API key) is never a label: see GET /limits
            }
        }
    }

    /// An attempt ended without an answer (connect error, timeout, cancelled): no longer in flight.
    func abandon(_ scope: String) async {
        if let fleet { try? await fleet.abandon(scope) }
        update(scope) { $0.inFlight = max(0, $0.inFlight - 1) }
    }

    static func learn(_ observation: ProviderLimitObservation, status: Int, window sentIn: Int? = nil, into budget: inout Budget,
                      at now: ContinuousClock.Instant, defaultHold: Duration) {
        if let limit = observation.limit {
            budget.limit = limit
            budget.limitGuessed = false
        }
        // The window the request went in; a provider silent about its budget is guessed from it.
        let sentIn = sentIn ?? budget.windowNumber
        let silent = observation.remaining == nil && (budget.limit == nil || budget.limitGuessed)
        if (200..<300).contains(status), sentIn >= budget.windowNumber - 1 {
            let served = budget.served[sentIn, default: 0] + 1
            budget.served[sentIn] = served
            if silent, sentIn == budget.refusedWindow {
                // Served in the window it refused in, answered after the 429: the guess is that window's.
                budget.limit = served
                budget.limitGuessed = true
            }
        }
        if let window = observation.window {
            budget.window = window
            budget.windowSaid = true
        } else if !budget.windowSaid, let reset = observation.reset, reset > (budget.window ?? .zero) {
            budget.window = reset
        }
        if let remaining = observation.remaining {
            // What this answer counted does not include requests still in flight, nor the due
            // reservations about to go (read after a new window made its reservations due).
            func left() -> Int { max(0, remaining - budget.inFlight - budget.due) }
            let reset = observation.reset.map { now.advanced(by: $0) }
            // A reset later than the one known (by more than the headers' one-second resolution)
            // is a new window: its count replaces the old. Within a window counts only go down
            // (answers arrive out of order), and the reset is the latest announced (whole
            // seconds rounded up: the later estimate is the safer one; the earliest, tried in
            // session 17, let more through than the provider took under load).
            if let known = budget.reset, let reset, reset <= known.advanced(by: .seconds(1)), let current = budget.remaining {
                budget.remaining = min(current, left())
                budget.reset = max(known, reset)
            } else {
                if let known = budget.reset, let reset, reset > known {
                    // The provider's window ended before the estimate: the next reservations are due.
                    budget.nextWindow()
                }
                budget.remaining = left()
                budget.reset = reset ?? budget.reset
            }
        }
        var hold: Duration?
        if let retryAfter = observation.retryAfter {
            hold = retryAfter
        } else if status == 429 {
            // Refused without saying until when: until its reset when it gave one, else a short pause.
            hold = observation.reset ?? defaultHold
        }
        if let hold, hold > .zero {
            let until = now.advanced(by: hold)
            budget.hold = max(budget.hold ?? until, until)
            if status == 429 {
                if silent {
                    // A provider silent about its budget: guess it from what it served in the
                    // window this request went in (its answers still on their way count as they
                    // come), and its window from the longest hold, so that after this hold a
                    // window's worth goes and the rest take slots in the windows after.
                    if !budget.windowSaid { budget.window = max(budget.window ?? .zero, hold) }
                    if sentIn >= budget.refusedWindow ?? sentIn {
                        budget.refusedWindow = sentIn
                        if let served = budget.served[sentIn], served > 0 {
                            budget.limit = served
                            budget.limitGuessed = true
                        }
                    }
                }
                // Refused: nothing is left until the hold ends, whatever the headers counted.
                budget.remaining = 0
                var next = until
                if silent, budget.limitGuessed, sentIn == budget.windowNumber, budget.windowNumber > 0, let window = budget.window {
                    if let clean = budget.clean, budget.sent <= clean {
                        // A count served whole before is refused: the provider's window likely began
                        // during our last burst. The next window begins that burst's length after the
                        // hold, past the provider's next start, so a burst no longer spans two of its windows.
                        if let first = budget.firstSent, let last = budget.lastSent {
                            next = until.advanced(by: min(first.duration(to: last), window / 2))
                        }
                        budget.anchor = nil
                    } else if budget.anchor == nil, let known = budget.reset, known.advanced(by: window) > until {
                        // A probe (or a first guess) refused at its burst's end: the provider's window
                        // held the burst, so after the hold's window ours keep its schedule.
                        budget.anchor = known.advanced(by: window)
                    }
                }
                budget.reset = max(budget.reset ?? next, next)
            }
        }
    }

    /// Runs `body` on the scope's record, made (and room made for it) when missing.
    private func update<Result>(_ scope: String, _ body: (inout Budget) -> Result) -> Result {
        let shard = shards[Int(UInt(bitPattern: scope.hashValue) % UInt(shards.count))]
        let now = clock.now
        return shard.budgets.withLock { budgets in
            if budgets[scope] == nil, budgets.count >= shardCapacity { evict(&budgets, at: now) }
            return body(&budgets[scope, default: Budget(lastUsed: now)])
        }
    }

    /// Forgets idle scopes that know nothing still in force, then the least recently used idle
    /// ones, down to three quarters of the shard.
    private func evict(_ budgets: inout [String: Budget], at now: ContinuousClock.Instant) {
        budgets = budgets.filter { _, budget in
            var rolled = budget
            rolled.roll(at: now)
            return !budget.idle || rolled.hold != nil || rolled.reset != nil
        }
        let target = shardCapacity * 3 / 4
        guard budgets.count > target else { return }
        let idle = budgets.filter { $0.value.idle }.sorted { $0.value.lastUsed < $1.value.lastUsed }
        for (key, _) in idle.prefix(budgets.count - target) { budgets[key] = nil }
    }

    /// Every scope known now, for `GET /limits`. A header scope's value (an API key, say) is
    /// shown as a hash, never as itself.
    public func report() -> [ProviderScopeReport] {
        let now = clock.now
        var reports: [ProviderScopeReport] = []
        for shard in shards {
            shard.budgets.withLock { budgets in
                for (scope, budget) in budgets {
                    var rolled = budget
                    rolled.roll(at: now)
                    let shown: String = switch config.scope {
                    case .upstream: "upstream"
                    case .route: scope
                    case .header: "#" + String(RateLimitMiddleware.fnv1a(scope), radix: 16)
                    }
                    reports.append(ProviderScopeReport(
                        scope: shown, remaining: rolled.remaining, limit: rolled.limit,
                        resetSeconds: rolled.reset.map { Self.seconds(now.duration(to: $0)) },
                        holdSeconds: rolled.hold.map { Self.seconds(now.duration(to: $0)) },
                        inFlight: rolled.inFlight, waiting: rolled.waiting))
                }
            }
        }
        return reports.sorted { $0.scope < $1.scope }
    }

    static func seconds(_ duration: Duration) -> Double {
        max(0, Double(GatewayMetrics.nanoseconds(duration)) / 1e9)
    }
}
