import Synchronization

/// A token bucket's shape: refills at `ratePerSecond`, holds at most `burst` tokens.
public struct TokenBucketPolicy: Sendable, Equatable {
    public var ratePerSecond: Double
    public var burst: Int

    public init(ratePerSecond: Double, burst: Int) {
        self.ratePerSecond = ratePerSecond
        self.burst = burst
    }

    public init(_ config: RateLimitConfig) {
        self.init(ratePerSecond: config.rate.perSecond, burst: config.burst)
    }

    /// Time for an empty bucket to fill up: the window advertised in `RateLimit-Policy`.
    public var refillTime: Duration { .roundedSeconds(Double(burst) / ratePerSecond) }

    /// Nanoseconds between two tokens (at least 1).
    var intervalNanoseconds: Int64 {
        Int64(max(1, min(Double(Int64.max / 4) / Double(max(1, burst)), (1e9 / ratePerSecond).rounded())))
    }
}

extension Duration {
    /// Seconds from floating-point arithmetic, rounded to the microsecond: `1 / (1/60)` is
    /// 60.00000000000001, which would otherwise round up to 61 whole seconds in headers.
    static func roundedSeconds(_ seconds: Double) -> Duration {
        .microseconds(Int64((seconds * 1_000_000).rounded()))
    }
}

/// The result of asking for one token.
public struct RateLimitDecision: Sendable, Equatable {
    public var allowed: Bool
    /// Whole tokens left after this request.
    public var remaining: Int
    /// Until the bucket is full again (the quota is whole again).
    public var resetAfter: Duration
    /// When refused: until the next token; zero when allowed.
    public var retryAfter: Duration
    /// When allowed: how long the request must wait for its token (`on_limit: wait`); zero when
    /// it may go at once.
    public var wait: Duration

    public init(allowed: Bool, remaining: Int, resetAfter: Duration, retryAfter: Duration, wait: Duration = .zero) {
        self.allowed = allowed
        self.remaining = remaining
        self.resetAfter = resetAfter
        self.retryAfter = retryAfter
        self.wait = wait
    }
}

/// Where buckets live: in this process (`InMemoryRateLimitStore`) or shared by every replica
/// (`SharedRateLimitStore`, on Redis).
public protocol RateLimitStore: Sendable {
    /// Takes one token from `key`'s bucket as of `now`. With `maxWait` above zero a request whose
    /// token is due within it is allowed with `wait` set: its token is reserved, and it goes when
    /// the wait is over (or gives it back with `cancel`).
    func acquire(_ key: String, at now: ContinuousClock.Instant, maxWait: Duration) async throws -> RateLimitDecision
    /// `acquire` without waiting for I/O, or `nil` (taking nothing) when the store cannot
    /// decide without it. Lets a request answered at once (a cache hit) be charged on the
    /// server's thread.
    func acquireImmediately(_ key: String, at now: ContinuousClock.Instant, maxWait: Duration) -> RateLimitDecision?
    /// Gives back the token a waiting request reserved and will not use (its client left).
    func cancel(_ key: String, reservation: RateLimitDecision, at now: ContinuousClock.Instant) async
    /// `cancel` for a reservation `acquireImmediately` made, on the server's thread.
    func cancelImmediately(_ key: String, reservation: RateLimitDecision, at now: ContinuousClock.Instant)
    /// Whether other processes see the same buckets: then keys must not depend on this
    /// process (long keys are shortened with a hash every replica computes alike).
    var sharesBucketsAcrossProcesses: Bool { get }
    /// Whether `acquireImmediately` can decide (it returns a decision, not `nil`).
    var decidesImmediately: Bool { get }
}

extension RateLimitStore {
    public func acquireImmediately(_ key: String, at now: ContinuousClock.Instant, maxWait: Duration) -> RateLimitDecision? { nil }
    public func cancel(_ key: String, reservation: RateLimitDecision, at now: ContinuousClock.Instant) async {}
    public func cancelImmediately(_ key: String, reservation: RateLimitDecision, at now: ContinuousClock.Instant) {}
    public var sharesBucketsAcrossProcesses: Bool { false }
    public var decidesImmediately: Bool { false }

    /// One token now or a refusal: `on_limit: reject`.
    public func acquire(_ key: String, at now: ContinuousClock.Instant) async throws -> RateLimitDecision {
        try await acquire(key, at: now, maxWait: .zero)
    }
}

/// Token buckets in memory, one atomic each: the generic cell rate algorithm (GCRA).
///
/// A bucket is one instant, `full`: when it would be full again. Taking a token moves it on by
/// one interval (1 / rate) from whichever is later, itself or now; the token is there when the
/// new `full` is at most `burst` intervals ahead of now. That is exactly a token bucket of
/// `burst` refilling at `rate`, but as one 64-bit value it changes with one compare-and-swap:
/// a request never waits on a lock, however hot its key (`key: route`, one busy client), and
/// concurrent takes never grant more than the bucket holds. A request allowed to wait
/// (`on_limit: wait`) takes the slot after the last one reserved: reservations come out in
/// order (first come, first served) and at the rate, never faster.
///
/// Finding a key's bucket takes no lock either: each thread keeps the buckets it used in its own
/// table (`ThreadShard`, `ShardLocal`), and only a key the thread has not seen yet is looked up
/// (or made) in the shared table, under that table's shard lock.
///
/// Memory stays bounded: a bucket that has refilled completely is equivalent to no bucket, so
/// such buckets are dropped by a periodic sweep and whenever a shard is full. If a full shard
/// has too few refilled buckets, the ones closest to full go (those clients get a fresh bucket:
/// under a flood of distinct keys the limiter leans towards allowing rather than growing without
/// bound). A dropped bucket is marked retired, so threads holding it look the key up again. The
/// shared table never exceeds `maxKeys`; each thread's table holds at most `frontCapacity`.
public final class InMemoryRateLimitStore: RateLimitStore {
    public let policy: TokenBucketPolicy
    public let maxKeys: Int
    /// Nanoseconds per token, and the bucket's depth in nanoseconds (burst × interval).
    let interval: Int64
    let depth: Int64
    /// Instants are kept as nanoseconds since this one.
    private let origin: ContinuousClock.Instant

    final class Bucket: Sendable {
        /// When the bucket is full again, in nanoseconds since `origin` (GCRA's "theoretical
        /// arrival time" plus the depth).
        let full: Atomic<Int64>
        /// Dropped from the shared table: a thread holding it looks the key up again.
        let retired = Atomic<Bool>(false)

        init(full: Int64) {
            self.full = Atomic(full)
        }
    }

    struct ShardState {
        var buckets: [String: Bucket] = [:]
        var nextSweep: Int64?
    }

    final class Shard: Sendable {
        let state = Mutex(ShardState())
    }

    private let shards: [Shard]
    private let shardCapacity: Int
    private let sweepInterval: Int64
    /// Each thread's own buckets by key.
    private let fronts: ShardLocal<[String: Bucket]>
    let frontCapacity: Int

    public init(policy: TokenBucketPolicy, maxKeys: Int, shards: Int = 16) {
        self.policy = policy
        self.maxKeys = max(1, maxKeys)
        self.interval = policy.intervalNanoseconds
        self.depth = interval * Int64(max(1, policy.burst))
        self.origin = ContinuousClock.now
        let count = max(1, min(shards, self.maxKeys))
        self.shards = (0..<count).map { _ in Shard() }
        self.shardCapacity = self.maxKeys / count
        self.sweepInterval = max(1_000_000_000, depth)
        self.frontCapacity = min(self.maxKeys, 4_096)
        self.fronts = ShardLocal([:])
    }

    /// Buckets held right now (tests, diagnostics).
    public var count: Int {
        shards.reduce(0) { sum, shard in sum + shard.state.withLock { $0.buckets.count } }
    }

    public func acquire(_ key: String, at now: ContinuousClock.Instant, maxWait: Duration) async throws -> RateLimitDecision {
        take(key, at: now, maxWait: maxWait)
    }

    public func acquireImmediately(_ key: String, at now: ContinuousClock.Instant, maxWait: Duration) -> RateLimitDecision? {
        take(key, at: now, maxWait: maxWait)
    }

    public var decidesImmediately: Bool { true }

    public func cancel(_ key: String, reservation: RateLimitDecision, at now: ContinuousClock.Instant) async {
        giveBack(key, at: now)
    }

    public func cancelImmediately(_ key: String, reservation: RateLimitDecision, at now: ContinuousClock.Instant) {
        giveBack(key, at: now)
    }

    /// Takes one token, or (with `maxWait`) reserves the next one due within `maxWait`.
    public func take(_ key: String, at now: ContinuousClock.Instant, maxWait: Duration = .zero) -> RateLimitDecision {
        let t = nanoseconds(now)
        let bucket = bucket(for: key, at: t)
        let patience = max(0, GatewayMetrics.nanoseconds(maxWait))
        var current = bucket.full.load(ordering: .relaxed)
        while true {
            let next = max(current, t) + interval
            // How long after now the token is there: zero or less means at once.
            let due = next - depth - t
            if due > patience {
                return RateLimitDecision(allowed: false, remaining: 0, resetAfter: .nanoseconds(max(0, current - t)),
                                         retryAfter: .nanoseconds(due))
            }
            let (exchanged, found) = bucket.full.compareExchange(expected: current, desired: next, ordering: .relaxed)
            if exchanged {
                let ahead = next - t
                return RateLimitDecision(allowed: true, remaining: Int(max(0, depth - ahead) / interval),
                                         resetAfter: .nanoseconds(ahead), retryAfter: .zero, wait: .nanoseconds(max(0, due)))
            }
            current = found
        }
    }

    /// Returns one token to `key`'s bucket: a waiting request's reservation it will not use. The
    /// requests reserved after it keep their turn; the next new one is served that much sooner.
    public func giveBack(_ key: String, at now: ContinuousClock.Instant) {
        let t = nanoseconds(now)
        let bucket = bucket(for: key, at: t)
        var current = bucket.full.load(ordering: .relaxed)
        while current > t {
            let (exchanged, found) = bucket.full.compareExchange(expected: current, desired: max(t, current - interval),
                                                                  ordering: .relaxed)
            if exchanged { return }
            current = found
        }
    }

    private func nanoseconds(_ instant: ContinuousClock.Instant) -> Int64 {
        GatewayMetrics.nanoseconds(origin.duration(to: instant))
    }

    /// The key's bucket: from the calling thread's own table when it has it, else from (or made
    /// in) the shared table, then kept in the thread's table.
    @inline(__always)
    private func bucket(for key: String, at t: Int64) -> Bucket {
        let shard = ThreadShard.current
        return fronts.withValue(of: shard) { front in
            if let known = front[key] {
                if !known.retired.load(ordering: .relaxed) { return known }
                front[key] = nil
            }
            let found = shared(key, at: t)
            if front.count >= frontCapacity { trim(&front, at: t) }
            front[key] = found
            return found
        } ?? shared(key, at: t)
    }

    /// A thread's table is full: forget what is retired or full again (equivalent to nothing);
    /// when that is not enough, start over (the shared table still has every bucket).
    private func trim(_ front: inout [String: Bucket], at t: Int64) {
        front = front.filter { !$0.value.retired.load(ordering: .relaxed) && $0.value.full.load(ordering: .relaxed) > t }
        if front.count >= frontCapacity * 3 / 4 { front.removeAll(keepingCapacity: true) }
    }

    private func shared(_ key: String, at t: Int64) -> Bucket {
        let shard = shards[Int(UInt(bitPattern: key.hashValue) % UInt(shards.count))]
        return shard.state.withLock { state in
            if let due = state.nextSweep, t >= due {
                sweep(&state, at: t)
            } else if state.nextSweep == nil {
                state.nextSweep = t + sweepInterval
            }
            if let existing = state.buckets[key] { return existing }
            if state.buckets.count >= shardCapacity { evict(&state, at: t) }
            let created = Bucket(full: t)
            state.buckets[key] = created
            return created
        }
    }

    private func sweep(_ state: inout ShardState, at t: Int64) {
        state.buckets = state.buckets.filter { _, bucket in
            let keep = bucket.full.load(ordering: .relaxed) > t
            if !keep { bucket.retired.store(true, ordering: .relaxed) }
            return keep
        }
        state.nextSweep = t + sweepInterval
    }

    /// Frees room in a full shard: refilled buckets first, then those closest to full down to
    /// three quarters, so the O(n) work happens once per quarter-shard of new keys.
    private func evict(_ state: inout ShardState, at t: Int64) {
        sweep(&state, at: t)
        let target = shardCapacity * 3 / 4
        guard state.buckets.count > target else { return }
        let byFullness = state.buckets.sorted { $0.value.full.load(ordering: .relaxed) < $1.value.full.load(ordering: .relaxed) }
        for (key, bucket) in byFullness.prefix(state.buckets.count - target) {
            bucket.retired.store(true, ordering: .relaxed)
            state.buckets[key] = nil
        }
    }
}
