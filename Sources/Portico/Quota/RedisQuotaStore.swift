import Foundation
import Logging
import Metrics
import RedisClient
import Synchronization

/// A `quota` middleware's counts on a `stores.NAME` of `type: redis`, shared by every replica
/// and kept across restarts of all of them.
///
/// One counter per allocation per window, `key_prefix` + middleware + `:` + window id + `:` +
/// allocation (`portico:vendor-month:month:20261201T0000Z:team-a`), changed only by one Lua
/// script: it adds what this replica served while the store was away, then counts the request
/// if the count is below the limit, and makes the key expire an hour after its window ends (so
/// Redis holds the current windows and the one just past). A refused request is not counted.
/// The windows come from the gateway's clock, so replicas whose clocks disagree by a few seconds
/// disagree only that long about a boundary.
public final class RedisQuotaStore: QuotaStore {
    /// `KEYS[1]` the count; `ARGV` limit, milliseconds to live when new, requests served
    /// meanwhile by this replica alone. Returns allowed (0/1) and the count after it.
    static let script = RedisScript("""
        local limit = tonumber(ARGV[1])
        local carried = tonumber(ARGV[3])
        local used
        if carried > 0 then
          used = redis.call('INCRBY', KEYS[1], carried)
        else
          used = tonumber(redis.call('GET', KEYS[1]) or '0')
        end
        local allowed = 0
        if used < limit then
          allowed = 1
          used = redis.call('INCR', KEYS[1])
        end
        if used > 0 and redis.call('PTTL', KEYS[1]) == -1 then
          redis.call('PEXPIRE', KEYS[1], ARGV[2])
        end
        return {allowed, used}
        """)

    /// A count outlives its window by this much: a replica whose clock is behind still finds it.
    static let expiryMargin = Duration.seconds(3600)

    /// `portico_quota_store_errors_total{store,kind}`.
    static let errors = LabelledCounters("portico_quota_store_errors_total")

    public let backend: RedisBucketStore
    /// The middleware's name: its counts' part of the key space.
    public let namespace: String
    public let onStoreError: QuotaConfig.StoreErrorPolicy
    /// The last counts seen, and what `on_store_error: local` counts on with.
    public let local: LocalQuotaCounts
    private let logger: Logger
    /// `portico_quota_store_duration_seconds{store}`: one call to the store, failures included.
    private let latency: Metrics.Timer
    /// Whether the last call failed: outages are logged when they start and end, not per request.
    private let failing = Atomic<Bool>(false)

    init(backend: RedisBucketStore, namespace: String, onStoreError: QuotaConfig.StoreErrorPolicy,
         local: LocalQuotaCounts, logger: Logger) {
        self.backend = backend
        self.namespace = namespace
        self.onStoreError = onStoreError
        self.local = local
        var logger = logger
        logger[metadataKey: "store"] = "\(backend.name)"
        logger[metadataKey: "middleware"] = "\(namespace)"
        self.logger = logger
        self.latency = Metrics.Timer(label: "portico_quota_store_duration_seconds", dimensions: [("store", backend.name)])
    }

    /// The Redis key of `allocation`'s count in `window`.
    func redisKey(_ allocation: QuotaAllocation, in window: CalendarWindow) -> [UInt8] {
        Array((backend.config.keyPrefix + namespace + ":" + window.id + ":" + allocation.name).utf8)
    }

    public func charge(_ allocation: QuotaAllocation, in window: CalendarWindow, at now: Date) async -> QuotaDecision {
        let carried = onStoreError == .local ? local.takePending(allocation, in: window) : 0
        do throws(RedisError) {
            let used = try await count(allocation, in: window, at: now, carried: carried)
            local.observe(used.count, allocation, in: window)
            return QuotaDecision(allowed: used.allowed, limit: allocation.limit, used: used.count)
        } catch {
            local.restorePending(carried, allocation, in: window)
            switch onStoreError {
            case .local:
                return local.take(allocation, in: window, pending: true)
            case .allow:
                return QuotaDecision(allowed: true, limit: allocation.limit, used: local.used(allocation, in: window))
            case .deny:
                return QuotaDecision(allowed: false, limit: allocation.limit, used: local.used(allocation, in: window),
                                     storeUnavailable: true)
            }
        }
    }

    private func count(_ allocation: QuotaAllocation, in window: CalendarWindow, at now: Date,
                       carried: Int) async throws(RedisError) -> (allowed: Bool, count: Int) {
        let start = ContinuousClock.now
        defer { latency.recordNanoseconds(GatewayMetrics.nanoseconds(start.duration(to: .now))) }
        let ttl = window.remaining(at: now) + Self.expiryMargin
        let ttlMilliseconds = max(1, ttl.wholeMilliseconds)
        do throws(RedisError) {
            let reply = try await backend.pool.evaluate(Self.script, keys: [.bytes(redisKey(allocation, in: window))], arguments: [
                .string(String(allocation.limit)), .string(String(ttlMilliseconds)), .string(String(carried)),
            ])
            guard let values = reply.array, values.count == 2, let allowed = values[0].int, let used = values[1].int else {
                throw RedisError(.protocolViolation, "unexpected reply from the quota script")
            }
            if failing.exchange(false, ordering: .relaxed) {
                logger.notice("quota store answering again")
            }
            return (allowed == 1, Int(clamping: used))
        } catch {
            Self.errors.increment([("store", backend.name), ("kind", StoreErrorKind(error).rawValue)])
            if !failing.exchange(true, ordering: .relaxed) {
                // Once per outage; `on_store_error` applies until the store answers again.
                logger.warning("quota store failed", metadata: [
                    "redis": "\(backend.config.shownURL)", "kind": "\(StoreErrorKind(error).rawValue)",
                    "error": "\(error.message)", "on_store_error": "\(onStoreError.rawValue)",
                ])
            }
            throw error
        }
    }
}
