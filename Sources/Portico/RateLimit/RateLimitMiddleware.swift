import HTTPTypes
import Metrics
import Synchronization

/// Limits each key (client address, header value, route, or a combination) to a token bucket:
/// `rate` sustained, `burst` at once. Over the limit a request is refused with 429
/// `rate_limited` and `Retry-After` (`on_limit: reject`), or waits for its token
/// (`on_limit: wait`): first come, first served, on a timer of its own event loop, never past
/// `max_wait` or its own deadline, with at most `max_waiting` requests waiting at once. A
/// request whose wait would be longer is refused at once, never after waiting. With `priority`,
/// a bucket's waiters go higher priority first (`PriorityLine`). Every response
/// (errors included) carries the IETF `RateLimit-Policy` and `RateLimit` headers unless
/// `headers: false`. Place it outside caching and retries, so a client is charged once per
/// request, however the request is served.
public struct RateLimitMiddleware: ImmediateMiddleware {
    /// The middleware instance's name: the policy name in the headers.
    public let name: String
    public let config: RateLimitConfig
    public let store: any RateLimitStore
    /// Requests waiting for their token now; carried over by a reload that keeps the store.
    public let queue: RateLimitQueue
    private let policyValue: String
    /// `priority: header:NAME`'s field.
    private let priorityField: HTTPField.Name?

    /// Tokens rate limiters took while the request was being tried for an answer at once, by
    /// middleware name, for the task that then finishes it (so it is charged once).
    enum TakenDecisions: RequestStatsKey {
        typealias Value = [String: RateLimitDecision]
    }

    /// `portico_ratelimit_rejected_total{route,reason}`.
    static let rejected = LabelledCounters("portico_ratelimit_rejected_total")
    /// The bucket every keyless request shares (`missing_key: shared`). NUL cannot occur in a
    /// header value or an address, so no real key collides with it.
    static let missingKeyBucket = "\u{0}missing"
    /// Keys longer than this are shortened to a prefix plus a hash, so memory per bucket is
    /// bounded whatever clients send.
    static let maxKeyBytes = 128

    public init(name: String, _ config: RateLimitConfig, store: (any RateLimitStore)? = nil, queue: RateLimitQueue? = nil) {
        self.name = name
        self.config = config
        let policy = TokenBucketPolicy(config)
        self.store = store ?? InMemoryRateLimitStore(policy: policy, maxKeys: config.maxKeys)
        self.queue = queue ?? RateLimitQueue(middleware: name)
        self.policyValue = RateLimitHeaders.policy(name: name, policy: policy)
        self.priorityField = config.onLimit == .wait ? config.priorityHeader.flatMap { HTTPField.Name($0) } : nil
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        // A token taken while trying to answer at once is this request's: it is not charged twice.
        let taken = context.stats.update { $0[TakenDecisions.self]?.removeValue(forKey: name) }
        let decision: RateLimitDecision
        if let taken {
            // A token that was still due (`wait` above zero) was waited for before the task began
            // (`deferStart`); a wait cut short gave it back there, and the request goes no further.
            if taken.wait > .zero, Task.isCancelled { throw CancellationError() }
            decision = taken
        } else {
            let key = try bucketKey(for: request, context: context)
            let patience = self.patience(context)
            let reserved = try await store.acquire(key, at: context.clock.now, maxWait: patience)
            if let priorityField, patience > .zero, !reserved.allowed || reserved.wait > .zero {
                let priority = WaitPriority(headerValue: request.headerFields[priorityField])
                decision = try await waitInLine(reserved, key: key, priority: priority, patience: patience, context: context)
            } else {
                try check(reserved, patience: patience, context: context)
                if reserved.wait > .zero {
                    try await wait(for: reserved, key: key, context: context)
                }
                decision = reserved
            }
        }
        try check(decision, patience: .zero, context: context)
        do {
            var response = try await next(request, context)
            addHeaders(to: &response.headerFields, decision)
            return response
        } catch var error as GatewayError {
            addHeaders(to: &error.headerFields, decision)
            throw error
        }
    }

    /// Charges the request on the server's thread when the store can decide at once. When the
    /// inner chain then needs a task, the decision travels with the request to `handle`. A
    /// request whose token is due later keeps its reservation and its task starts then
    /// (`deferStart`); with `priority:` it gives the reservation back and waits in the bucket's
    /// line in `handle` instead. The server's thread never waits.
    public func handleImmediately(_ request: GatewayRequest, context: RequestContext,
                                  next: ImmediateNextHandler) throws -> GatewayResponse? {
        let key = try bucketKey(for: request, context: context)
        let patience = self.patience(context)
        guard let decision = store.acquireImmediately(key, at: context.clock.now, maxWait: patience) else { return nil }
        // With priorities a refused request may still take a lower one's turn: `handle` tries.
        if !decision.allowed, priorityField != nil, patience > .zero { return nil }
        try check(decision, patience: patience, context: context)
        if decision.wait > .zero {
            // The same test the gateway makes before it looks for the deferred start, so a start
            // is never deferred where nothing would wait for it.
            if defersStart {
                try deferStart(decision, key: key, context: context)
            } else {
                store.cancelImmediately(key, reservation: decision, at: context.clock.now)
            }
            return nil
        }
        do {
            guard var response = try next(request, context) else {
                context.stats.update { $0[TakenDecisions.self, default: [:]][name] = decision }
                return nil
            }
            addHeaders(to: &response.headerFields, decision)
            return response
        } catch var error as GatewayError {
            addHeaders(to: &error.headerFields, decision)
            throw error
        }
    }

    /// `deferStart`: a waiting limit without priorities whose store decides at once.
    public var defersStart: Bool { config.onLimit == .wait && priorityField == nil && store.decidesImmediately }

    /// How long this request may wait for a token: `max_wait`, never past its own deadline;
    /// zero with `on_limit: reject`.
    private func patience(_ context: RequestContext) -> Duration {
        guard config.onLimit == .wait else { return .zero }
        return max(.zero, min(config.maxWait, context.remaining))
    }

    /// Waits out a reservation in the queue; a full queue refuses it, a client that leaves gives
    /// its token back and never reaches the upstream.
    private func wait(for reservation: RateLimitDecision, key: String, context: RequestContext) async throws {
        guard queue.enter(limit: config.maxWaiting) else {
            await store.cancel(key, reservation: reservation, at: context.clock.now)
            throw refusal(.queueFull, retryAfter: reservation.wait, decision: reservation, context: context)
        }
        defer { queue.leave() }
        let start = context.clock.now
        do {
            try await LoopTimer.sleep(until: start.advanced(by: reservation.wait), clock: context.clock)
        } catch {
            await store.cancel(key, reservation: reservation, at: context.clock.now)
            throw error
        }
        Self.recordWait(start.duration(to: context.clock.now), in: queue, stats: context.stats)
    }

    /// Lets a request whose token is due later start its task then (`DeferredStart`): while it
    /// waits it holds its reservation and its place in the queue, not a task with the chain's
    /// frames (nginx's `limit_req` delays a request the same way, as a timer on its connection).
    /// A wait cut short gives both back; a full queue refuses at once.
    private func deferStart(_ reservation: RateLimitDecision, key: String, context: RequestContext) throws {
        guard queue.enter(limit: config.maxWaiting) else {
            store.cancelImmediately(key, reservation: reservation, at: context.clock.now)
            throw refusal(.queueFull, retryAfter: reservation.wait, decision: reservation, context: context)
        }
        let clock = context.clock, stats = context.stats, start = clock.now
        // Holds only what the end of the wait needs (not the whole context), as long as it waits.
        let began: @Sendable (Bool) -> Void = { [store, queue] cancelled in
            queue.leave()
            if cancelled {
                store.cancelImmediately(key, reservation: reservation, at: clock.now)
            } else {
                Self.recordWait(start.duration(to: clock.now), in: queue, stats: stats)
            }
        }
        context.stats.update {
            $0[TakenDecisions.self, default: [:]][name] = reservation
            $0[DeferredStart.self] = DeferredStart.Value(at: start.advanced(by: reservation.wait), began: began)
        }
    }

    /// A wait that ended in going: the histogram and the access log's `ratelimit_wait`.
    private static func recordWait(_ waited: Duration, in queue: RateLimitQueue, stats: RequestStats) {
        queue.record(waited: waited)
        stats.update { $0.extra.append(("ratelimit_wait", "\(Int64(GatewayMetrics.nanoseconds(waited) / 1_000_000))ms")) }
    }

    /// Waits for a turn in the bucket's priority line (`PriorityLine`): the store's reservation,
    /// or a lower-priority waiter's when the store had none within `patience`. Returns the
    /// decision the request goes with; throws the 429 when it gets no turn, or was displaced
    /// while waiting by a higher-priority request.
    private func waitInLine(_ reserved: RateLimitDecision, key: String, priority: WaitPriority, patience: Duration,
                            context: RequestContext) async throws -> RateLimitDecision {
        let start = context.clock.now
        let owned = reserved.allowed
        guard queue.enter(limit: config.maxWaiting) else {
            if owned { await store.cancel(key, reservation: reserved, at: context.clock.now) }
            throw refusal(.queueFull, retryAfter: owned ? reserved.wait : reserved.retryAfter, decision: reserved, context: context)
        }
        defer { queue.leave() }
        guard let place = queue.line.join(key: key, priority: priority, turn: owned ? start.advanced(by: reserved.wait) : nil,
                                          deadline: start.advanced(by: patience)) else {
            throw refusal(.waitTooLong, retryAfter: reserved.retryAfter, decision: reserved, context: context)
        }
        defer { queue.line.leave(place) }
        while true {
            guard let turn = queue.line.turn(of: place) else {
                // Its turn went to a higher-priority request, which goes with its reservation.
                throw refusal(.displaced, retryAfter: config.rate.per / config.rate.count, decision: reserved, context: context)
            }
            if context.clock.now >= turn { break }
            do {
                try await LoopTimer.sleep(until: turn, clock: context.clock, interrupt: place.interrupt)
            } catch {
                await store.cancel(key, reservation: reserved, at: context.clock.now)
                throw error
            }
        }
        Self.recordWait(start.duration(to: context.clock.now), in: queue, stats: context.stats)
        context.stats.update { $0.extra.append(("ratelimit_priority", priority.description)) }
        // A turn taken over leaves the bucket as empty as the refusal said.
        return RateLimitDecision(allowed: true, remaining: owned ? reserved.remaining : 0, resetAfter: reserved.resetAfter,
                                 retryAfter: .zero)
    }

    /// The request's bucket; throws when the key is missing and `missing_key: reject`.
    private func bucketKey(for request: GatewayRequest, context: RequestContext) throws -> String {
        if let extracted = Self.key(for: request, parts: config.key, route: context.route,
                                    stableHash: store.sharesBucketsAcrossProcesses) { return extracted }
        guard config.missingKey != .reject else {
            throw GatewayError.rateLimitKeyMissing(config.key.map(\.description).joined(separator: " + "))
        }
        return Self.missingKeyBucket
    }

    /// Throws the 429 for a refused decision: `wait_too_long` when waiting was allowed but the
    /// token is further away than the request may wait.
    private func check(_ decision: RateLimitDecision, patience: Duration, context: RequestContext) throws {
        guard !decision.allowed else { return }
        throw refusal(patience > .zero ? .waitTooLong : .rate, retryAfter: decision.retryAfter,
                      decision: decision, context: context)
    }

    /// The 429 for a refusal, counted by reason.
    private func refusal(_ reason: RateLimitRefusal, retryAfter: Duration, decision: RateLimitDecision,
                         context: RequestContext) -> GatewayError {
        Self.rejected.increment([("route", context.route ?? ""), ("reason", reason.rawValue)])
        var fields = HTTPFields()
        addHeaders(to: &fields, decision)
        context.stats.update { $0.extra.append(("ratelimit", reason.rawValue)) }
        return GatewayError.rateLimited(retryAfter: retryAfter, headerFields: fields)
    }

    private func addHeaders(to fields: inout HTTPFields, _ decision: RateLimitDecision) {
        guard config.headers else { return }
        // Appended: a quota or another limit further in keeps its item beside this one.
        RateLimitHeaders.append(policyValue, to: RateLimitHeaders.policyName, in: &fields)
        RateLimitHeaders.append(RateLimitHeaders.state(name: name, decision: decision), to: RateLimitHeaders.stateName, in: &fields)
    }

    /// The bucket key, or `nil` when a part is missing (no address, header absent or empty).
    /// Parts are joined with NUL, which none of them can contain. `stableHash`: long keys are
    /// shortened with a hash that is the same in every process (for a shared store) instead of
    /// the per-process seeded one.
    public static func key(for request: GatewayRequest, parts: [RateLimitConfig.KeyPart], route: String?,
                           stableHash: Bool = false) -> String? {
        var key = ""
        for (index, part) in parts.enumerated() {
            if index > 0 { key += "\u{0}" }
            switch part {
            case .clientIP:
                guard !request.clientAddress.isEmpty else { return nil }
                key += request.clientAddress
            case .route:
                guard let route else { return nil }
                key += route
            case .header(let name):
                guard let fieldName = HTTPField.Name(name) else { return nil }
                let values = request.headerFields[values: fieldName]
                let joined = values.joined(separator: ",")
                guard !joined.isEmpty else { return nil }
                key += joined
            }
        }
        if key.utf8.count > maxKeyBytes {
            // Hasher is seeded per process, so clients cannot aim for collisions.
            let prefix = String(decoding: key.utf8.prefix(64), as: UTF8.self)
            let hash = stableHash ? fnv1a(key) : UInt64(UInt(bitPattern: key.hashValue))
            key = prefix + "\u{0}#" + String(hash, radix: 16) + ":" + String(key.utf8.count)
        }
        return key
    }

    /// 64-bit FNV-1a: the same in every process, so replicas sharing a store agree on keys.
    static func fnv1a(_ text: String) -> UInt64 {
        let offsetBasis: UInt64 = 0xCBF2_9CE4_8422_2325, prime: UInt64 = 0x0000_0100_0000_01B3
        return text.utf8.reduce(offsetBasis) { ($0 ^ UInt64($1)) &* prime }
    }
}
