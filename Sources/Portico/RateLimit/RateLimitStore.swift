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

    public init(allowed: Bool, remaining: Int, resetAfter: Duration, retryAfter: Duration) {
        self.allowed = allowed
        self.remaining = remaining
        self.resetAfter = resetAfter
        self.retryAfter = retryAfter
    }
}

/// Where buckets live. In memory per process today; the protocol is async so a shared store
/// (Redis, a peer protocol) can implement it later without touching the middleware.
public protocol RateLimitStore: Sendable {
    /// Takes one token from `key`'s bucket as of `now`.
    func acquire(_ key: String, at now: ContinuousClock.Instant) async throws -> RateLimitDecision
    /// Takes one token without waiting, or returns `nil` (taking nothing) when the store cannot
    /// decide without I/O. Lets a request answered at once (a cache hit) be charged on the
    /// server's thread.
    func acquireImmediately(_ key: String, at now: ContinuousClock.Instant) -> RateLimitDecision?
    /// Whether other processes see the same buckets: then keys must not depend on this
    /// process (long keys are shortened with a hash every replica computes alike).
    var sharesBucketsAcrossProcesses: Bool { get }
}

extension RateLimitStore {
    public func acquireImmediately(_ key: String, at now: ContinuousClock.Instant) -> RateLimitDecision? { nil }
    public var sharesBucketsAcrossProcesses: Bool { false }
}

/// Token buckets in memory, sharded so concurrent requests for different keys rarely contend
/// on one lock.
///
/// Memory stays bounded: a bucket that has refilled completely is equivalent to no bucket,
/// so such buckets are dropped by a periodic sweep and whenever a shard is full. If a full
/// shard has too few refilled buckets, the least recently used go (those clients get a fresh
/// bucket: under a flood of distinct keys the limiter leans towards allowing rather than
/// growing without bound). The total never exceeds `maxKeys`.
public final class InMemoryRateLimitStore: RateLimitStore {
    public let policy: TokenBucketPolicy
    public let maxKeys: Int

    struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }

    struct ShardState {
        var buckets: [String: Bucket] = [:]
        var nextSweep: ContinuousClock.Instant?
    }

    final class Shard: Sendable {
        let state = Mutex(ShardState())
    }

    private let shards: [Shard]
    private let shardCapacity: Int
    private let sweepInterval: Duration

    public init(policy: TokenBucketPolicy, maxKeys: Int, shards: Int = 16) {
        self.policy = policy
        self.maxKeys = max(1, maxKeys)
        let count = max(1, min(shards, self.maxKeys))
        self.shards = (0..<count).map { _ in Shard() }
        self.shardCapacity = self.maxKeys / count
        self.sweepInterval = max(.seconds(1), policy.refillTime)
    }

    /// Buckets held right now (tests, diagnostics).
    public var count: Int {
        shards.reduce(0) { sum, shard in sum + shard.state.withLock { $0.buckets.count } }
    }

    public func acquire(_ key: String, at now: ContinuousClock.Instant) async throws -> RateLimitDecision {
        take(key, at: now)
    }

    public func acquireImmediately(_ key: String, at now: ContinuousClock.Instant) -> RateLimitDecision? {
        take(key, at: now)
    }

    /// The synchronous core of `acquire`.
    public func take(_ key: String, at now: ContinuousClock.Instant) -> RateLimitDecision {
        let shard = shards[Int(UInt(bitPattern: key.hashValue) % UInt(shards.count))]
        let policy = self.policy
        let burst = Double(policy.burst)
        return shard.state.withLock { state in
            if let due = state.nextSweep, now >= due {
                sweep(&state, now: now)
            } else if state.nextSweep == nil {
                state.nextSweep = now.advanced(by: sweepInterval)
            }
            var bucket: Bucket
            if let existing = state.buckets[key] {
                bucket = existing
                Self.refill(&bucket, now: now, policy: policy)
            } else {
                if state.buckets.count >= shardCapacity { evict(&state, now: now) }
                bucket = Bucket(tokens: burst, updated: now)
            }
            // The epsilon absorbs float drift (ten refills of 0.1 sum to 0.9999999999999999).
            let allowed = bucket.tokens >= 1 - 1e-9
            if allowed { bucket.tokens = max(0, bucket.tokens - 1) }
            state.buckets[key] = bucket
            let missing = burst - bucket.tokens
            return RateLimitDecision(
                allowed: allowed,
                remaining: Int(bucket.tokens.rounded(.down)),
                resetAfter: .roundedSeconds(missing / policy.ratePerSecond),
                retryAfter: allowed ? .zero : .roundedSeconds((1 - bucket.tokens) / policy.ratePerSecond))
        }
    }

    static func refill(_ bucket: inout Bucket, now: ContinuousClock.Instant, policy: TokenBucketPolicy) {
        // Callers read the clock before taking the lock, so `now` can be a little behind.
        guard now > bucket.updated else { return }
        let elapsed = bucket.updated.duration(to: now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        bucket.tokens = min(Double(policy.burst), bucket.tokens + seconds * policy.ratePerSecond)
        bucket.updated = now
    }

    /// Whether the bucket would be full by `now`: then forgetting it changes nothing.
    static func isFull(_ bucket: Bucket, now: ContinuousClock.Instant, policy: TokenBucketPolicy) -> Bool {
        var copy = bucket
        refill(&copy, now: now, policy: policy)
        return copy.tokens >= Double(policy.burst)
    }

    private func sweep(_ state: inout ShardState, now: ContinuousClock.Instant) {
        let policy = self.policy
        state.buckets = state.buckets.filter { !Self.isFull($0.value, now: now, policy: policy) }
        state.nextSweep = now.advanced(by: sweepInterval)
    }

    /// Frees room in a full shard: refilled buckets first, then the least recently used down
    /// to three quarters, so the O(n) work happens once per quarter-shard of new keys.
    private func evict(_ state: inout ShardState, now: ContinuousClock.Instant) {
        sweep(&state, now: now)
        let target = shardCapacity * 3 / 4
        guard state.buckets.count > target else { return }
        let byAge = state.buckets.sorted { $0.value.updated < $1.value.updated }
        for (key, _) in byAge.prefix(state.buckets.count - target) {
            state.buckets[key] = nil
        }
    }
}
