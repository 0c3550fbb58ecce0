import Crypto
import Foundation
import Logging
import Metrics
import RedisClient
import Synchronization

/// `store:` on a cache: a second tier on Redis, below every replica's memory tier (issue #43).
///
/// What Redis holds, under `{key_prefix}cache:{middleware}:` —
/// - `e:{hash}`: a hash per primary key (authority and target, SHA-256 so a long URL makes a
///   short key): one field per `Vary` variant, each a `CacheEntryCodec` record. It expires when
///   its longest-lived variant's freshness and stale windows have passed.
/// - `l:{hash}`: a short lease while one replica fetches a missing key for the fleet.
/// - `paths` (a sorted set by name, for purges by path prefix) and `expiry` (the same members by
///   expiry, to prune `paths` as entries expire), and `t:{hash of tag}` (the keys of one tag).
/// - `seq` and `events`: a counter and a stream of invalidations and purges, which every replica
///   waits on to drop what its memory tier holds (`CacheInvalidationFeed`).
///
/// Only what the memory tier may store reaches it — RFC 9111's shared-cache rules are decided
/// once, before either tier — and only entries of at most `max_entry_bytes`. Nothing here
/// stands between a request and its answer: a failed or slow command (the store's `timeout`)
/// is a miss, a write that cannot be made is skipped, and both are counted.
final class SharedCacheTier: Sendable {
    /// The `outcome` label of `portico_cache_store_total`: a closed set.
    enum Outcome: String, CaseIterable {
        /// A read found a usable entry (copied into memory).
        case hit
        /// A read found nothing usable.
        case miss
        /// An entry written for the fleet.
        case write
        /// Not written: larger than `max_entry_bytes`, no time to live, or the key's variants full.
        case skipped
        /// Not written: too many writes already in flight.
        case dropped
        /// Waited for the replica that held the key's lease, and got its response.
        case collapsed
        /// Another replica's invalidation or purge applied to this memory tier.
        case invalidated
        /// A command failed or timed out.
        case error
    }

    static let outcomes = LabelledCounters("portico_cache_store_total")
    /// The most writes (entries, invalidations) on their way to Redis at once; more are dropped.
    static let maxWritesInFlight = 256
    /// Variants one key keeps in Redis (the memory tier's own bound applies there).
    static let maxVariants = 32

    /// `KEYS`: the entry hash, its lease, `paths`, `expiry`, then one set per tag. `ARGV`: the
    /// variant's field, the record, time to live (ms), the index member, the variant bound, the
    /// key's hash. Writes the variant, keeps the hash alive as long as its longest variant,
    /// frees the lease (whoever waits can read now), indexes the key, prunes expired index
    /// members. Returns 1, or 0 when the key already has its bound of other variants.
    static let writeScript = RedisScript("""
        local ttl = tonumber(ARGV[3])
        if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then
          redis.call('DEL', KEYS[2])
          return 0
        end
        redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
        if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
        redis.call('DEL', KEYS[2])
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
        redis.call('ZADD', KEYS[3], 0, ARGV[4])
        redis.call('ZADD', KEYS[4], 'GT', now + redis.call('PTTL', KEYS[1]), ARGV[4])
        local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 64)
        for _, member in ipairs(expired) do
          redis.call('ZREM', KEYS[3], member)
          redis.call('ZREM', KEYS[4], member)
        end
        for i = 5, #KEYS do
          redis.call('SADD', KEYS[i], ARGV[6])
          if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
        end
        return 1
        """)

    /// `KEYS`: `paths`, `expiry`, `seq`, `events`, then the entry hash and its memory-only
    /// marker (`key`) or the tag's set (`tag`). `ARGV`: kind (`key`, `prefix`, `tag`), what it names (the primary key, the path
    /// prefix, the tag), the prefix's authority (empty: any), the namespace, this replica's id.
    /// Deletes what the purge names and publishes it for every replica's memory tier — a key no
    /// replica can hold is not published, so the POSTs to uncached URLs an API mostly sees cost
    /// one script call and no event. Returns the keys deleted and the event's sequence number.
    static let purgeScript = RedisScript("""
        local deleted = 0
        local kind = ARGV[1]
        if kind == 'key' then
          deleted = redis.call('DEL', KEYS[5])
          -- Neither in Redis nor (too large for it) in some replica's memory: nobody to tell.
          if redis.call('DEL', KEYS[6]) == 0 and deleted == 0 then return {0, 0} end
        elseif kind == 'tag' then
          for _, hash in ipairs(redis.call('SMEMBERS', KEYS[5])) do
            deleted = deleted + redis.call('DEL', ARGV[4] .. 'e:' .. hash)
          end
          redis.call('DEL', KEYS[5])
        else
          local members = redis.call('ZRANGEBYLEX', KEYS[1], '[' .. ARGV[2], '[' .. ARGV[2] .. '\\255')
          for _, member in ipairs(members) do
            local _, authority, hash = string.match(member, '^(.-)%z(.-)%z([^%z]*)$')
            if hash and (ARGV[3] == '' or authority == ARGV[3]) then
              deleted = deleted + redis.call('DEL', ARGV[4] .. 'e:' .. hash)
              redis.call('ZREM', KEYS[1], member)
              redis.call('ZREM', KEYS[2], member)
            end
          end
        end
        local seq = redis.call('INCR', KEYS[3])
        redis.call('PEXPIRE', KEYS[3], 86400000)
        redis.call('XADD', KEYS[4], 'MAXLEN', '~', 1000, '*', 'seq', seq, 'origin', ARGV[5], 'kind', kind,
                   'value', ARGV[2], 'authority', ARGV[3])
        redis.call('PEXPIRE', KEYS[4], 86400000)
        return {deleted, seq}
        """)

    let cache: String
    let backend: RedisBucketStore
    let maxEntryBytes: Int
    /// How long a replica waits for the one fetching a key for the fleet before fetching itself.
    let peerWait: Duration
    let pollInterval: Duration
    /// Stale windows the cache grants responses without their own (`stale_while_revalidate`,
    /// `stale_if_error`): an entry lives in Redis as long as either may still serve it.
    let defaultStaleWindow: Duration
    /// Tells this replica's own events apart in the stream.
    let replicaID: String
    let namespace: String
    private let logger: Logger
    private let latency: Metrics.Timer
    private let writesInFlight = Atomic<Int>(0)
    /// Bound of a purge or of a write: not on a request's path, so it may wait longer than `timeout`.
    private let backgroundTimeout: Duration

    init(cache: String, backend: RedisBucketStore, maxEntryBytes: Int, peerWait: Duration, defaultStaleWindow: Duration,
         pollInterval: Duration = .milliseconds(25), logger: Logger) {
        self.cache = cache
        self.backend = backend
        self.maxEntryBytes = maxEntryBytes
        self.peerWait = peerWait
        self.pollInterval = pollInterval
        self.defaultStaleWindow = defaultStaleWindow
        self.replicaID = (0..<2).map { _ in String(UInt64.random(in: .min ... .max), radix: 16) }.joined()
        self.namespace = "\(backend.config.keyPrefix)cache:\(cache):"
        var logger = logger
        logger[metadataKey: "cache"] = "\(cache)"
        self.logger = logger
        latency = Metrics.Timer(label: "portico_cache_store_duration_seconds", dimensions: [("cache", cache)])
        backgroundTimeout = max(backend.config.timeout, .seconds(1))
    }

    func count(_ outcome: Outcome, by amount: Int64 = 1) {
        Self.outcomes.increment([("cache", cache), ("outcome", outcome.rawValue)], by: amount)
    }

    // MARK: Keys

    /// The first 16 bytes of the SHA-256 of `text`, in hex (built by hand: `String(format:)`
    /// per byte costs more than the hash).
    static func hash(_ text: String) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var hex: [UInt8] = []
        hex.reserveCapacity(32)
        for byte in SHA256.hash(data: Array(text.utf8)).prefix(16) {
            hex.append(digits[Int(byte >> 4)])
            hex.append(digits[Int(byte & 15)])
        }
        return String(decoding: hex, as: UTF8.self)
    }

    func entryKey(hash: String) -> [UInt8] { Array("\(namespace)e:\(hash)".utf8) }
    private func leaseKey(hash: String) -> [UInt8] { Array("\(namespace)l:\(hash)".utf8) }
    /// Set while some replica's memory holds a response for the key that Redis does not (larger
    /// than `max_entry_bytes`), so that invalidating it is still published.
    private func memoryOnlyKey(hash: String) -> [UInt8] { Array("\(namespace)m:\(hash)".utf8) }
    private func tagKey(_ tag: String) -> [UInt8] { Array("\(namespace)t:\(Self.hash(tag))".utf8) }
    private var pathsKey: [UInt8] { Array("\(namespace)paths".utf8) }
    private var expiryKey: [UInt8] { Array("\(namespace)expiry".utf8) }
    var sequenceKey: [UInt8] { Array("\(namespace)seq".utf8) }
    var eventsKey: [UInt8] { Array("\(namespace)events".utf8) }

    /// One field per set of `Vary` values: a new response for the same values replaces the old.
    private static func variantField(_ vary: VaryKey) -> String {
        guard !vary.names.isEmpty else { return "-" }
        var text = ""
        for (name, value) in zip(vary.names, vary.values) {
            text += name + "\u{1}" + (value.map { "=" + $0 } ?? "") + "\u{2}"
        }
        return hash(text)
    }

    // MARK: Reading

    /// The live variants Redis holds for `key`, freshest first, as received now; `nil` when the
    /// store did not answer (the caller goes on as if it had no store).
    func read(_ key: String, now: ContinuousClock.Instant, wallNow: Date) async -> [CacheEntry]? {
        let start = ContinuousClock.now
        defer { latency.recordNanoseconds(GatewayMetrics.nanoseconds(start.duration(to: .now))) }
        let reply: RESPValue
        do throws(RedisError) {
            reply = try await backend.send(["HGETALL", .bytes(entryKey(hash: Self.hash(key)))])
        } catch {
            count(.error)
            return nil
        }
        let values: [RESPValue] = switch reply {
        case .array(let items): stride(from: 1, to: items.count, by: 2).map { items[$0] }
        case .map(let pairs): pairs.map(\.value)
        default: []
        }
        var entries: [CacheEntry] = []
        for value in values {
            guard case .bulkString(let record) = value,
                  let entry = CacheEntryCodec.decode(record, key: key, now: now, wallNow: wallNow),
                  timeToLive(entry, at: now) > .zero else { continue }
            entries.append(entry)
        }
        return entries.sorted { $0.age(at: now) < $1.age(at: now) }
    }

    /// How much longer Redis keeps `entry`: its freshness left plus the longest stale window,
    /// and for a response with validators (`ETag`, `Last-Modified`) a while longer still —
    /// `revalidationKeep(of:)` — so that the replica that finds it stale can validate it with a
    /// `304` instead of fetching it whole, as the memory tier does.
    func timeToLive(_ entry: CacheEntry, at now: ContinuousClock.Instant) -> Duration {
        let f = entry.freshness
        let window = max(f.staleWhileRevalidate ?? defaultStaleWindow, f.staleIfError ?? defaultStaleWindow)
        let serving = f.lifetime - entry.age(at: now) + (f.mustRevalidate ? .zero : window)
        return serving + (entry.hasValidators ? Self.revalidationKeep(of: f.lifetime) : .zero)
    }

    /// A stale response with validators stays its own lifetime again, at least five minutes and
    /// at most a day: long enough to be validated, bounded so Redis does not fill with the stale.
    static func revalidationKeep(of lifetime: Duration) -> Duration {
        min(max(lifetime, .seconds(300)), .seconds(86_400))
    }

    // MARK: Writing

    /// Whether `write` would send `entry` to Redis (its lease is then freed by the write).
    func willWrite(_ entry: CacheEntry, now: ContinuousClock.Instant) -> Bool {
        entry.body.readableBytes <= maxEntryBytes && timeToLive(entry, at: now) >= .milliseconds(1)
    }

    /// Writes `entry` for the fleet in the background (the caller may be libmicrohttpd's thread
    /// finishing a streamed response: it never waits for Redis).
    func write(_ entry: CacheEntry, now: ContinuousClock.Instant, wallNow: Date) {
        let ttl = timeToLive(entry, at: now)
        guard ttl >= .milliseconds(1) else {
            count(.skipped)
            return
        }
        guard reserveWrite() else {
            count(.dropped)
            return
        }
        guard entry.body.readableBytes <= maxEntryBytes else {
            count(.skipped)
            let marker = memoryOnlyKey(hash: Self.hash(entry.key))
            Task { [self] in
                defer { writesInFlight.subtract(1, ordering: .relaxed) }
                _ = try? await backend.send(["SET", .bytes(marker), "1", "PX", .string(String(ttl.wholeMilliseconds))],
                                            timeout: backgroundTimeout)
            }
            return
        }
        let record = CacheEntryCodec.encode(entry, age: entry.age(at: now), wallNow: wallNow)
        let hash = Self.hash(entry.key)
        let (authority, target) = Self.split(entry.key)
        let tags = CachePurgeTarget.tags(of: entry.headerFields)
        let keys = [entryKey(hash: hash), leaseKey(hash: hash), pathsKey, expiryKey] + tags.map(tagKey)
        let arguments: [RedisArgument] = [
            .string(Self.variantField(entry.vary)), .bytes(record), .string(String(ttl.wholeMilliseconds)),
            .string("\(target)\u{0}\(authority)\u{0}\(hash)"), .string(String(Self.maxVariants)), .string(hash),
        ]
        Task { [self] in
            defer { writesInFlight.subtract(1, ordering: .relaxed) }
            do throws(RedisError) {
                let reply = try await backend.evaluate(Self.writeScript, keys: keys, arguments: arguments, timeout: backgroundTimeout)
                count(reply.int == 1 ? .write : .skipped)
            } catch {
                count(.error)
            }
        }
    }

    /// Drops `key` in Redis and tells every replica (an unsafe method's invalidation), in the background.
    func invalidate(_ key: String) {
        guard reserveWrite() else {
            count(.dropped)
            return
        }
        Task { [self] in
            defer { writesInFlight.subtract(1, ordering: .relaxed) }
            _ = try? await purge(.key(key))
        }
    }

    /// Deletes what `target` names in Redis and publishes it to every replica; returns the keys
    /// deleted in Redis. `timeout`: on a request's path, the store's own (default: a purge's).
    func purge(_ target: CachePurgeTarget, timeout: Duration? = nil) async throws(RedisError) -> Int {
        let fixed = [pathsKey, expiryKey, sequenceKey, eventsKey]
        let (kind, value, authority, named): (String, String, String, [[UInt8]]) = switch target {
        case .key(let key): ("key", key, "", [entryKey(hash: Self.hash(key)), memoryOnlyKey(hash: Self.hash(key))])
        case .prefix(let path, let authority): ("prefix", path, authority ?? "", [])
        case .tag(let tag): ("tag", tag, "", [tagKey(tag)])
        }
        do throws(RedisError) {
            let reply = try await backend.evaluate(Self.purgeScript, keys: fixed + named, arguments: [
                .string(kind), .string(value), .string(authority), .string(namespace), .string(replicaID),
            ], timeout: timeout ?? backgroundTimeout)
            return Int(reply.array?.first?.int ?? 0)
        } catch {
            count(.error)
            throw error
        }
    }

    private func reserveWrite() -> Bool {
        let before = writesInFlight.add(1, ordering: .relaxed).oldValue
        guard before < Self.maxWritesInFlight else {
            writesInFlight.subtract(1, ordering: .relaxed)
            return false
        }
        return true
    }

    // MARK: One fetch for the fleet

    /// Takes the key's lease (held at most `peerWait`): `nil` when another replica holds it or
    /// the store did not answer, else the fence that frees it.
    func takeLease(_ key: String) async -> String?? {
        let fence = RedisLease.fence()
        do throws(RedisError) {
            return .some(try await RedisLease.take(leaseKey(hash: Self.hash(key)), fence: fence, for: peerWait, on: backend) ? fence : nil)
        } catch {
            count(.error)
            return .none
        }
    }

    /// Frees the key's lease if it is still `fence`'s (the response could not be shared).
    func releaseLease(_ key: String, fence: String) {
        Task { [self] in
            try? await RedisLease.release(leaseKey(hash: Self.hash(key)), fence: fence, on: backend, timeout: backgroundTimeout)
        }
    }

    /// Whether the key's lease is still held by someone.
    func leaseHeld(_ key: String) async -> Bool {
        (try? await backend.send(["EXISTS", .bytes(leaseKey(hash: Self.hash(key)))]).int) == 1
    }

    // MARK: Helpers

    /// The primary key's authority and target.
    static func split(_ key: String) -> (authority: Substring, target: Substring) {
        guard let separator = key.firstIndex(of: "\u{0}") else { return ("", Substring(key)) }
        return (key[..<separator], key[key.index(after: separator)...])
    }
}
