/// A `rate_limit` middleware's buckets in a shared store (`store: NAME`), with what applies
/// when the store fails or is slower than its `timeout` (`on_store_error`).
public final class SharedRateLimitStore: RateLimitStore {
    public let backend: RedisBucketStore
    /// The middleware's name: its buckets' part of the key space.
    public let namespace: String
    public let policy: TokenBucketPolicy
    public let onStoreError: RateLimitConfig.StoreErrorPolicy
    /// `on_store_error: local`: this process's buckets at the same rate.
    public let local: InMemoryRateLimitStore

    init(backend: RedisBucketStore, namespace: String, policy: TokenBucketPolicy,
         onStoreError: RateLimitConfig.StoreErrorPolicy, local: InMemoryRateLimitStore) {
        self.backend = backend
        self.namespace = namespace
        self.policy = policy
        self.onStoreError = onStoreError
        self.local = local
    }

    public var sharesBucketsAcrossProcesses: Bool { true }

    /// `maxWait` above zero reserves the next slot on the server (GCRA: the reply says when
    /// this request may go), so replicas interleave instead of all retrying at the refill.
    public func acquire(_ key: String, at now: ContinuousClock.Instant, maxWait: Duration) async throws -> RateLimitDecision {
        do {
            if maxWait > .zero {
                return try await backend.reserve(key, namespace: namespace, policy: policy, maxWait: maxWait)
            }
            return try await backend.take(key, namespace: namespace, policy: policy)
        } catch {
            switch onStoreError {
            case .local:
                return local.take(key, at: now, maxWait: maxWait)
            case .allow:
                return RateLimitDecision(allowed: true, remaining: policy.burst, resetAfter: .zero, retryAfter: .zero)
            case .deny:
                return RateLimitDecision(allowed: false, remaining: 0, resetAfter: policy.refillTime, retryAfter: .seconds(1))
            }
        }
    }

    /// Gives a waiting request's slot back on the server, or to the local bucket when the store
    /// fails now; best effort: a slot given back nowhere is only a token wasted.
    public func cancel(_ key: String, reservation: RateLimitDecision, at now: ContinuousClock.Instant) async {
        do {
            try await backend.giveBack(key, namespace: namespace, policy: policy)
        } catch {
            if onStoreError == .local { local.giveBack(key, at: now) }
        }
    }
}
