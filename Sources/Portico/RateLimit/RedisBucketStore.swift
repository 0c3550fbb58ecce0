import CoreMetrics
import Logging
import Metrics
import RedisClient
import Synchronization

/// The token buckets of one `stores.NAME` of `type: redis`, shared by every replica.
///
/// A bucket is a hash (`tokens`, `time`) updated by one Lua script, atomically on the server:
/// it refills by the time elapsed on the server's own clock (`TIME`, so replicas whose clocks
/// disagree still agree), takes a token, and sets the key to expire when the bucket would be
/// full again — a full bucket and no bucket are the same, so Redis holds only active keys.
/// The script is called by its SHA-1 (`EVALSHA`) and sent whole only when the server lacks it.
public final class RedisBucketStore: Sendable {
    /// `KEYS[1]` the bucket; `ARGV` rate per second, burst. Returns allowed (0/1), whole tokens
    /// left, microseconds until full, microseconds until the next token when refused.
    static let script = RedisScript("""
        local rate = tonumber(ARGV[1])
        local burst = tonumber(ARGV[2])
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
        local stored = redis.call('HMGET', KEYS[1], 'tokens', 'time')
        local tokens = tonumber(stored[1])
        local time = tonumber(stored[2])
        if tokens == nil or time == nil then
          tokens = burst
          time = now
        elseif now > time then
          tokens = math.min(burst, tokens + (now - time) * rate / 1000000)
          time = now
        end
        local allowed = 0
        if tokens >= 1 - 1e-9 then
          allowed = 1
          tokens = math.max(0, tokens - 1)
        end
        local reset = math.ceil((burst - tokens) * 1000000 / rate)
        local retry = 0
        if allowed == 0 then retry = math.ceil((1 - tokens) * 1000000 / rate) end
        redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'time', string.format('%.0f', time))
        redis.call('PEXPIRE', KEYS[1], math.max(1, math.ceil(reset / 1000)))
        return {allowed, math.floor(tokens), reset, retry}
        """)

    /// `on_limit: wait` (GCRA). `KEYS[1]` holds one number: when the bucket is full again, in
    /// microseconds of the server's clock. `ARGV` microseconds per token, the bucket's depth
    /// (burst × interval), how long the request may wait. Returns allowed (0/1), whole tokens
    /// left, microseconds until full, and when allowed the microseconds until this request may go
    /// (its reserved slot), when refused until a token could be had.
    static let reserveScript = RedisScript("""
        local interval = tonumber(ARGV[1])
        local depth = tonumber(ARGV[2])
        local patience = tonumber(ARGV[3])
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
        local stored = redis.call('GET', KEYS[1])
        local full = now
        if stored then full = math.max(now, tonumber(stored)) end
        local nextFull = full + interval
        local due = nextFull - depth - now
        if due > patience then
          return {0, 0, full - now, due}
        end
        redis.call('SET', KEYS[1], string.format('%.0f', nextFull), 'PX', math.max(1, math.ceil((nextFull - now) / 1000)))
        if due < 0 then due = 0 end
        return {1, math.floor(math.max(0, depth - (nextFull - now)) / interval), nextFull - now, due}
        """)

    /// Gives one reserved slot back (`KEYS[1]` as above; `ARGV[1]` microseconds per token).
    static let giveBackScript = RedisScript("""
        local stored = redis.call('GET', KEYS[1])
        if not stored then return 0 end
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
        local full = tonumber(stored) - tonumber(ARGV[1])
        if full <= now then
          redis.call('DEL', KEYS[1])
        else
          redis.call('SET', KEYS[1], string.format('%.0f', full), 'PX', math.max(1, math.ceil((full - now) / 1000)))
        end
        return 1
        """)

    /// Deletes a lease only while it still holds the caller's fence (shared tokens, the fleet
    /// cache). KEYS[1] the lease; ARGV[1] the fence.
    static let compareAndDeleteScript = RedisScript("""
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """)

    /// `portico_ratelimit_store_errors_total{store,kind}`.
    static let errors = LabelledCounters("portico_ratelimit_store_errors_total")

    /// The `stores.NAME` key.
    public let name: String
    public let config: StoreConfig
    let pool: RedisConnectionPool
    private let logger: Logger
    /// `portico_ratelimit_store_duration_seconds{store}`: one call to the store, failures included.
    private let latency: Metrics.Timer
    /// Whether the last call failed: outages are logged when they start and end, not per request.
    private let failing = Atomic<Bool>(false)

    init(name: String, config: StoreConfig, loops: EventLoops = .shared, logger: Logger) throws {
        self.name = name
        self.config = config
        var logger = logger
        logger[metadataKey: "store"] = "\(name)"
        self.logger = logger
        self.pool = try RedisConnectionPool(configuration: config.redisConfiguration, eventLoopGroup: loops.group, logger: logger)
        self.latency = Metrics.Timer(label: "portico_ratelimit_store_duration_seconds", dimensions: [("store", name)])
    }

    /// Opens a first connection in the background, so a wrong password or an unreachable
    /// server is in the log at start rather than at the first request.
    func warmUp() {
        Task { [self] in
            do throws(RedisError) {
                try await pool.warmUp()
                logger.info("rate limit store connected", metadata: ["redis": "\(config.shownURL)"])
            } catch {
                logger.error("rate limit store cannot connect", metadata: [
                    "redis": "\(config.shownURL)", "kind": "\(StoreErrorKind(error).rawValue)", "error": "\(error.message)",
                ])
            }
        }
    }

    /// Takes one token from `key`'s bucket in `namespace` (the middleware's name).
    func take(_ key: String, namespace: String, policy: TokenBucketPolicy) async throws(RedisError) -> RateLimitDecision {
        let start = ContinuousClock.now
        defer { latency.recordNanoseconds(GatewayMetrics.nanoseconds(start.duration(to: .now))) }
        let redisKey = Array((config.keyPrefix + namespace + ":").utf8) + Array(key.utf8)
        do throws(RedisError) {
            let reply = try await pool.evaluate(Self.script, keys: [.bytes(redisKey)], arguments: [
                .string(String(policy.ratePerSecond)), .string(String(policy.burst)),
            ])
            guard let values = reply.array, values.count == 4, let allowed = values[0].int, let remaining = values[1].int,
                  let reset = values[2].int, let retry = values[3].int else {
                throw RedisError(.protocolViolation, "unexpected reply from the rate limit script")
            }
            if failing.exchange(false, ordering: .relaxed) {
                logger.notice("rate limit store answering again")
            }
            return RateLimitDecision(allowed: allowed == 1, remaining: Int(remaining),
                                     resetAfter: .microseconds(reset), retryAfter: .microseconds(retry))
        } catch {
            noteFailure(error)
            throw error
        }
    }

    /// Reserves the next slot of `key`'s GCRA bucket within `maxWait` (`on_limit: wait`).
    func reserve(_ key: String, namespace: String, policy: TokenBucketPolicy, maxWait: Duration) async throws(RedisError) -> RateLimitDecision {
        let interval = max(1, policy.intervalNanoseconds / 1_000)
        let reply = try await call(Self.reserveScript, key: waitingKey(key, namespace: namespace), arguments: [
            String(interval), String(interval * Int64(max(1, policy.burst))),
            String(max(0, GatewayMetrics.nanoseconds(maxWait) / 1_000)),
        ])
        guard let values = reply.array, values.count == 4, let allowed = values[0].int, let remaining = values[1].int,
              let reset = values[2].int, let due = values[3].int else {
            throw RedisError(.protocolViolation, "unexpected reply from the rate limit script")
        }
        return RateLimitDecision(allowed: allowed == 1, remaining: Int(remaining), resetAfter: .microseconds(reset),
                                 retryAfter: allowed == 1 ? .zero : .microseconds(due),
                                 wait: allowed == 1 ? .microseconds(due) : .zero)
    }

    /// Gives a reserved slot back.
    func giveBack(_ key: String, namespace: String, policy: TokenBucketPolicy) async throws(RedisError) {
        _ = try await call(Self.giveBackScript, key: waitingKey(key, namespace: namespace),
                           arguments: [String(max(1, policy.intervalNanoseconds / 1_000))])
    }

    /// GCRA buckets live apart from the token buckets (`:w:`), so switching `on_limit` never
    /// reads one kind as the other.
    private func waitingKey(_ key: String, namespace: String) -> [UInt8] {
        Array((config.keyPrefix + namespace + ":w:").utf8) + Array(key.utf8)
    }

    /// One script call, timed and counted like `take` (also the provider limits' budgets).
    func evaluate(_ script: RedisScript, key: [UInt8], arguments: [String]) async throws(RedisError) -> RESPValue {
        try await call(script, key: key, arguments: arguments)
    }

    /// One command or script call for another feature on this store (shared tokens), timed and
    /// counted like `take`, with its own `timeout` when the store's is too short for it.
    func send(_ arguments: [RedisArgument], timeout: Duration? = nil) async throws(RedisError) -> RESPValue {
        try await observed { () async throws(RedisError) -> RESPValue in
            try await pool.send(arguments, timeout: timeout.map { .nanoseconds(GatewayMetrics.nanoseconds($0)) })
        }
    }

    func evaluate(_ script: RedisScript, keys: [[UInt8]], arguments: [RedisArgument], timeout: Duration?) async throws(RedisError) -> RESPValue {
        try await observed { () async throws(RedisError) -> RESPValue in
            try await pool.evaluate(script, keys: keys.map { .bytes($0) }, arguments: arguments,
                                    timeout: timeout.map { .nanoseconds(GatewayMetrics.nanoseconds($0)) })
        }
    }

    private func observed(_ body: () async throws(RedisError) -> RESPValue) async throws(RedisError) -> RESPValue {
        let start = ContinuousClock.now
        defer { latency.recordNanoseconds(GatewayMetrics.nanoseconds(start.duration(to: .now))) }
        do throws(RedisError) {
            let reply = try await body()
            if failing.exchange(false, ordering: .relaxed) {
                logger.notice("rate limit store answering again")
            }
            return reply
        } catch {
            noteFailure(error)
            throw error
        }
    }

    /// One script call, timed and counted like `take`.
    private func call(_ script: RedisScript, key: [UInt8], arguments: [String]) async throws(RedisError) -> RESPValue {
        try await observed { () async throws(RedisError) -> RESPValue in
            try await pool.evaluate(script, keys: [.bytes(key)], arguments: arguments.map { .string($0) })
        }
    }

    private func noteFailure(_ error: RedisError) {
        Self.errors.increment([("store", name), ("kind", StoreErrorKind(error).rawValue)])
        if !failing.exchange(true, ordering: .relaxed) {
            // Once per outage; `on_store_error` applies until the store answers again.
            logger.warning("rate limit store failed", metadata: [
                "redis": "\(config.shownURL)", "kind": "\(StoreErrorKind(error).rawValue)", "error": "\(error.message)",
            ])
        }
    }

    /// Connections to the server open right now (tests, diagnostics).
    public var openConnections: Int { pool.openConnections }

    func shutdown() async {
        await pool.shutdown()
    }
}

/// The `kind` label of `portico_ratelimit_store_errors_total`: a closed set.
public enum StoreErrorKind: String, Sendable, CaseIterable {
    /// No answer within `timeout`.
    case timeout
    /// The server is down: refused, reset, or waiting out the reconnect backoff.
    case unavailable
    /// The password or ACL user was refused.
    case auth
    /// The TLS handshake failed.
    case tls
    /// The server answered with an error (out of memory, a read-only replica…).
    case server
    /// The server's answer made no sense.
    case `protocol`

    init(_ error: RedisError) {
        switch error.code {
        case .timeout: self = .timeout
        case .connection, .unavailable, .shutdown: self = .unavailable
        case .authentication: self = .auth
        case .tls: self = .tls
        case .server: self = .server
        case .protocolViolation: self = .protocol
        }
    }
}
