/// `type: rate_limit` — a token bucket per key.
public struct RateLimitConfig: Sendable, Equatable {
    /// One component of the bucket key; several combine into one key.
    public enum KeyPart: Sendable, Equatable, CustomStringConvertible {
        /// The connecting peer's address (not `X-Forwarded-For`: clients can forge it).
        case clientIP
        /// A request header's value (name lower-cased), e.g. an API key.
        case header(String)
        /// The matched route's name: one bucket per route.
        case route

        public var description: String {
            switch self {
            case .clientIP: "client_ip"
            case .header(let name): "header:\(name)"
            case .route: "route"
            }
        }
    }

    /// What happens when a request lacks a key part (e.g. the header is absent).
    public enum MissingKey: String, Sendable, Equatable, CaseIterable {
        /// All such requests share one bucket.
        case shared
        /// Refused with 400 `rate_limit_key_missing`: the client can fix the request, waiting
        /// would not help, so 429 would mislead.
        case reject
    }

    /// What a request gets when the shared store fails or is slower than its `timeout`.
    public enum StoreErrorPolicy: String, Sendable, Equatable, CaseIterable {
        /// A bucket in this process at the same rate: an outage neither opens nor shuts the gate.
        case local
        /// Let every request through.
        case allow
        /// Refuse every request with 429.
        case deny
    }

    /// What a request over the limit gets.
    public enum OnLimit: String, Sendable, Equatable, CaseIterable {
        /// 429 at once (the default).
        case reject
        /// Waits for its token, up to `max_wait` and its deadline; 429 at once when the token is further away.
        case wait
    }

    public var key: [KeyPart] = [.clientIP]
    public var rate: Rate
    /// Bucket capacity: requests a rested client may send at once.
    public var burst: Int
    public var missingKey: MissingKey = .shared
    /// Whether responses carry `RateLimit-Policy` and `RateLimit`.
    public var headers: Bool = true
    /// Buckets kept in memory at most; beyond it, refilled and then least recently used ones go.
    public var maxKeys: Int = 100_000
    /// `stores.NAME` holding the buckets, shared by every replica; `nil`: in this process.
    public var store: String?
    public var onStoreError: StoreErrorPolicy = .local
    public var onLimit: OnLimit = .reject
    /// `on_limit: wait`: the longest a request waits for its token.
    public var maxWait: Duration = .seconds(1)
    /// `on_limit: wait`: requests waiting at once; beyond, 429 at once.
    public var maxWaiting: Int = 10_000
    /// `on_limit: wait`: the request header (lower-cased name) whose value (`high`, `normal`,
    /// `low`) orders the waiting requests of one bucket; `nil`: first come, first served.
    public var priorityHeader: String?

    /// `burst` defaults to one second's worth of `rate`, rounded up (at least 1).
    public init(rate: Rate, burst: Int? = nil) {
        self.rate = rate
        self.burst = burst ?? Self.defaultBurst(for: rate)
    }

    public static func defaultBurst(for rate: Rate) -> Int {
        // Clamped: a Rate built in code (not parsed) could still be absurd.
        max(1, Int(min(rate.perSecond.rounded(.up), Double(Int32.max))))
    }
}
