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

    public func acquire(_ key: String, at now: ContinuousClock.Instant) async throws -> RateLimitDecision {
        do {
            return try await backend.take(key, namespace: namespace, policy: policy)
        } catch {
            switch onStoreError {
            case .local:
                return local.take(key, at: now)
            case .allow:
                return RateLimitDecision(allowed: true, remaining: policy.burst, resetAfter: .zero, retryAfter: .zero)
            case .deny:
                return RateLimitDecision(allowed: false, remaining: 0, resetAfter: policy.refillTime, retryAfter: .seconds(1))
            }
        }
    }
}
