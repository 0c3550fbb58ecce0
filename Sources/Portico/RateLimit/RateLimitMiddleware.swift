import HTTPTypes

/// Limits each key (client address, header value, route, or a combination) to a token bucket:
/// `rate` sustained, `burst` at once. Refused requests get 429 `rate_limited` with
/// `Retry-After`; every response (errors included) carries the IETF `RateLimit-Policy` and
/// `RateLimit` headers unless `headers: false`. Place it outside caching and retries, so a
/// client is charged once per request, however the request is served.
public struct RateLimitMiddleware: ImmediateMiddleware {
    /// The middleware instance's name: the policy name in the headers.
    public let name: String
    public let config: RateLimitConfig
    public let store: any RateLimitStore
    private let policyValue: String

    /// Tokens rate limiters took while the request was being tried for an answer at once, by
    /// middleware name, for the task that then finishes it (so it is charged once).
    enum TakenDecisions: RequestStatsKey {
        typealias Value = [String: RateLimitDecision]
    }

    static let rejected = LabelledCounters("portico_ratelimit_rejected_total")
    /// The bucket every keyless request shares (`missing_key: shared`). NUL cannot occur in a
    /// header value or an address, so no real key collides with it.
    static let missingKeyBucket = "\u{0}missing"
    /// Keys longer than this are shortened to a prefix plus a hash, so memory per bucket is
    /// bounded whatever clients send.
    static let maxKeyBytes = 128

    public init(name: String, _ config: RateLimitConfig, store: (any RateLimitStore)? = nil) {
        self.name = name
        self.config = config
        let policy = TokenBucketPolicy(config)
        self.store = store ?? InMemoryRateLimitStore(policy: policy, maxKeys: config.maxKeys)
        self.policyValue = RateLimitHeaders.policy(name: name, policy: policy)
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        // A token taken while trying to answer at once is this request's: it is not charged twice.
        let taken = context.stats.update { $0[TakenDecisions.self]?.removeValue(forKey: name) }
        let decision: RateLimitDecision
        if let taken {
            decision = taken
        } else {
            decision = try await store.acquire(try bucketKey(for: request, context: context), at: context.clock.now)
        }
        try check(decision, context: context)
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
    /// inner chain then needs a task, the decision travels with the request to `handle`.
    public func handleImmediately(_ request: GatewayRequest, context: RequestContext,
                                  next: ImmediateNextHandler) throws -> GatewayResponse? {
        let key = try bucketKey(for: request, context: context)
        guard let decision = store.acquireImmediately(key, at: context.clock.now) else { return nil }
        try check(decision, context: context)
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

    /// The request's bucket; throws when the key is missing and `missing_key: reject`.
    private func bucketKey(for request: GatewayRequest, context: RequestContext) throws -> String {
        if let extracted = Self.key(for: request, parts: config.key, route: context.route,
                                    stableHash: store.sharesBucketsAcrossProcesses) { return extracted }
        guard config.missingKey != .reject else {
            throw GatewayError.rateLimitKeyMissing(config.key.map(\.description).joined(separator: " + "))
        }
        return Self.missingKeyBucket
    }

    /// Throws the 429 for a refused decision.
    private func check(_ decision: RateLimitDecision, context: RequestContext) throws {
        guard !decision.allowed else { return }
        Self.rejected.increment([("route", context.route ?? "")])
        var fields = HTTPFields()
        addHeaders(to: &fields, decision)
        throw GatewayError.rateLimited(retryAfter: decision.retryAfter, headerFields: fields)
    }

    private func addHeaders(to fields: inout HTTPFields, _ decision: RateLimitDecision) {
        guard config.headers else { return }
        fields[RateLimitHeaders.policyName] = policyValue
        fields[RateLimitHeaders.stateName] = RateLimitHeaders.state(name: name, decision: decision)
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
