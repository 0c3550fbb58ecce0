import HTTPTypes
import Logging
@testable import Portico
import PorticoTesting
import RedisClient
import Testing

/// RFC 9111 across replicas (issue #43): caches of separate "replicas" — each its own memory
/// tier and middleware, as separate processes have — on one real `redis-server` and one manual
/// clock. What one stored, another serves exactly as the memory tier would have: its age, its
/// variants, its validation, its stale windows, its refusals.
@Suite("Fleet cache tier: RFC 9111 semantics hold across replicas", .serialized,
       .enabled(if: RedisServer.available, "redis-server is not installed"))
struct FleetCacheReplicaTests {
    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
    let clock = ManualClock()

    /// One Redis and the replicas' caches on it.
    final class Fleet: Sendable {
        let redis: RedisServer
        let stores: RateLimitStores
        let pool: RedisConnectionPool

        init() async throws {
            redis = try await RedisServer.start()
            stores = try redis.fleetStores(timeout: .seconds(2))
            pool = try RedisConnectionPool(configuration: redis.configuration())
        }

        func replica(clock: ManualClock, _ configure: (inout CacheConfig) -> Void = { _ in }) throws -> CacheMiddleware {
            var config = CacheFixture.config(configure)
            config.store = "fleet"
            let backend = try #require(stores.backend(named: "fleet"))
            let tier = SharedCacheTier(cache: "test", backend: backend, maxEntryBytes: config.maxEntryBytes, peerWait: .seconds(5),
                                       defaultStaleWindow: max(config.staleWhileRevalidate, config.staleIfError),
                                       logger: FleetCacheReplicaTests.logger)
            let store = TieredCacheStore(memory: InMemoryCacheStore(maxBytes: config.maxBytes), fleet: tier, clock: clock)
            let metrics = CacheMetrics(cache: "test")
            return CacheMiddleware(name: "test", config, store: store, metrics: metrics,
                                   feed: CacheInvalidationFeed(tier: tier, memory: store.memory, metrics: metrics,
                                                               logger: FleetCacheReplicaTests.logger))
        }

        /// Variants Redis holds for the fixture's URL (the writes are made in the background).
        func variants(_ target: String = "/items/1") async throws -> Int {
            let key = SharedCacheTier.hash(CacheMiddleware.key(authority: "api.test", target: target))
            return Int(try await pool.send(["HLEN", .string("portico:cache:test:e:\(key)")]).int ?? 0)
        }

        /// Until nobody holds a fetch lease (freed in the background): a replica that found one
        /// would wait for it on the manual clock, which nobody moves.
        func noLeases() async throws {
            try await Eventually.wait(timeout: .seconds(30), "the leases to be freed") {
                (try? await self.pool.send(["KEYS", "portico:cache:test:l:*"]).array?.isEmpty) == true
            }
        }

        func waitForVariants(_ count: Int, _ target: String = "/items/1") async throws {
            try await Eventually.wait(timeout: .seconds(30), "\(count) variants in Redis") { (try? await self.variants(target)) == count }
            try await noLeases()
        }

        func stop() async {
            await pool.shutdown()
            await stores.shutdown()
            redis.stop()
        }
    }

    func send(_ cache: CacheMiddleware, _ upstream: ScriptedUpstream, _ method: HTTPRequest.Method = .get,
              headers: [(String, String)] = []) async throws -> GatewayResponse {
        try await cache.handle(CacheFixture.request(method, "/items/1", headers: headers), context: CacheFixture.context(clock),
                               next: upstream.next)
    }

    @Test("a response stored through one replica is a hit on another, with its age: Age and ttl count the time in Redis")
    func ageCarries() async throws {
        let fleet = try await Fleet()
        let (a, b) = (try fleet.replica(clock: clock), try fleet.replica(clock: clock))
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")]))
        #expect(try await send(a, upstream).cacheStatus == "portico; fwd=uri-miss; fwd-status=200; ttl=60; stored")
        try await fleet.waitForVariants(1)
        clock.advance(by: .seconds(15))
        let hit = try await send(b, upstream)
        #expect(hit.cacheStatus == "portico; hit; ttl=45")
        #expect(hit.headerFields[.age] == "15" && hit.text == "payload")
        #expect(upstream.calls == 1)
        // Copied into B's memory: the next one does not read Redis (and still ages).
        clock.advance(by: .seconds(5))
        #expect(try await send(b, upstream).headerFields[.age] == "20")
        await fleet.stop()
    }

    @Test("Vary: another replica serves the stored variant to a matching request only")
    func varyAcrossReplicas() async throws {
        let fleet = try await Fleet()
        let (a, b) = (try fleet.replica(clock: clock), try fleet.replica(clock: clock))
        let upstream = ScriptedUpstream { _, request in
            CacheFixture.response(headers: [("Cache-Control", "max-age=60"), ("Vary", "Accept-Language")],
                                  body: request.headerFields[.acceptLanguage] ?? "none")
        }
        _ = try await send(a, upstream, headers: [("Accept-Language", "de")])
        try await fleet.waitForVariants(1)
        let english = try await send(b, upstream, headers: [("Accept-Language", "en")])
        #expect(english.text == "en" && english.cacheStatus?.contains("fwd=vary-miss") == true, "\(english.cacheStatus ?? "")")
        #expect(upstream.calls == 2)
        try await fleet.waitForVariants(2)
        let german = try await send(b, upstream, headers: [("Accept-Language", "DE")])  // normalised as in memory
        #expect(german.text == "de" && german.cacheStatus == "portico; hit; ttl=60")
        let third = try fleet.replica(clock: clock)
        #expect(try await send(third, upstream, headers: [("Accept-Language", "en")]).text == "en")
        #expect(upstream.calls == 2)
        await fleet.stop()
    }

    @Test("a stale fleet entry is validated with its ETag by the replica that finds it; the 304 refreshes it for every replica")
    func revalidationAcrossReplicas() async throws {
        let fleet = try await Fleet()
        let (a, b, c) = (try fleet.replica(clock: clock), try fleet.replica(clock: clock), try fleet.replica(clock: clock))
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? CacheFixture.response(headers: [("Cache-Control", "max-age=10"), ("ETag", "\"v1\""), ("X-Gen", "1")])
                : CacheFixture.response(304, headers: [("Cache-Control", "max-age=100"), ("ETag", "\"v1\""), ("X-Gen", "2")], body: "")
        }
        _ = try await send(a, upstream)
        try await fleet.waitForVariants(1)
        clock.advance(by: .seconds(11))
        let validated = try await send(b, upstream)
        #expect(upstream.requests.last?.headerFields[.ifNoneMatch] == "\"v1\"")
        #expect(validated.text == "payload" && validated.headerFields[HTTPField.Name("X-Gen")!] == "2")
        #expect(validated.cacheStatus == "portico; fwd=stale; fwd-status=304; ttl=100; stored")
        // The freshened entry reaches Redis: C, which never saw it, serves it fresh.
        try await Eventually.wait(timeout: .seconds(30), "the freshened entry in Redis") {
            let read = await c.tiers?.fleet.read(CacheMiddleware.key(authority: "api.test", target: "/items/1"),
                                                 now: clock.now, wallNow: clock.wallNow)
            return read?.first?.headerFields[HTTPField.Name("X-Gen")!] == "2"
        }
        let hit = try await send(c, upstream)
        #expect(hit.cacheStatus == "portico; hit; ttl=100" && hit.headerFields[HTTPField.Name("X-Gen")!] == "2")
        #expect(upstream.calls == 2)
        await fleet.stop()
    }

    @Test("a request's no-cache on a replica that never saw the URL: it validates with the ETag another replica stored, not an unconditional fetch")
    func noCacheValidatesWithFleetValidators() async throws {
        let fleet = try await Fleet()
        let (a, b) = (try fleet.replica(clock: clock), try fleet.replica(clock: clock))
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? CacheFixture.response(headers: [("Cache-Control", "max-age=60"), ("ETag", "\"v1\"")])
                : CacheFixture.response(304, headers: [("Cache-Control", "max-age=60"), ("ETag", "\"v1\"")], body: "")
        }
        _ = try await send(a, upstream)
        try await fleet.waitForVariants(1)
        let validated = try await send(b, upstream, headers: [("Cache-Control", "no-cache")])
        #expect(upstream.calls == 2)
        #expect(upstream.requests.last?.headerFields[.ifNoneMatch] == "\"v1\"")
        #expect(validated.status == .ok && validated.text == "payload")
        #expect(validated.cacheStatus?.contains("fwd-status=304") == true, "\(validated.cacheStatus ?? "")")
        await fleet.stop()
    }

    @Test("stale-if-error: a replica whose upstream fails serves the fleet's stale copy, within its window only")
    func staleIfErrorAcrossReplicas() async throws {
        let fleet = try await Fleet()
        let (a, b) = (try fleet.replica(clock: clock), try fleet.replica(clock: clock))
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? CacheFixture.response(headers: [("Cache-Control", "max-age=5, stale-if-error=60")])
                : CacheFixture.response(503, headers: [], body: "down")
        }
        _ = try await send(a, upstream)
        try await fleet.waitForVariants(1)
        clock.advance(by: .seconds(20))
        let stale = try await send(b, upstream)
        #expect(stale.status == .ok && stale.text == "payload")
        #expect(stale.cacheStatus?.contains("detail=stale-if-error") == true, "\(stale.cacheStatus ?? "")")
        clock.advance(by: .seconds(60))
        let third = try fleet.replica(clock: clock)
        #expect(try await send(third, upstream).status.code == 503)  // past the window: no longer served
        await fleet.stop()
    }

    @Test("Authorization: a response to a credentialed request is shared only when marked public, as in memory")
    func authorizationAcrossReplicas() async throws {
        let fleet = try await Fleet()
        let (a, b) = (try fleet.replica(clock: clock), try fleet.replica(clock: clock))
        let privateAnswer = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")]))
        _ = try await send(a, privateAnswer, headers: [("Authorization", "Bearer caller")])
        try await fleet.noLeases()
        #expect(try await fleet.variants() == 0)
        _ = try await send(b, privateAnswer, headers: [("Authorization", "Bearer caller")])
        #expect(privateAnswer.calls == 2)

        let publicAnswer = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "public, max-age=60")]))
        _ = try await send(a, publicAnswer, headers: [("Authorization", "Bearer caller")])
        try await fleet.waitForVariants(1)
        let third = try fleet.replica(clock: clock)
        #expect(try await send(third, publicAnswer, headers: [("Authorization", "Bearer other")]).cacheStatus == "portico; hit; ttl=60")
        #expect(publicAnswer.calls == 1)
        await fleet.stop()
    }

    @Test("time in Redis: freshness plus stale windows (none with must-revalidate), plus a while to be validated when it has validators")
    func lifetimes() async throws {
        let fleet = try await Fleet()
        let a = try fleet.replica(clock: clock) { $0.staleIfError = .seconds(300) }
        let tier = try #require(a.tiers?.fleet)
        let strict = CacheFixture.entry([("Cache-Control", "max-age=30, must-revalidate")], clock: clock)
        let lenient = CacheFixture.entry([("Cache-Control", "max-age=30")], clock: clock)
        #expect(tier.timeToLive(strict, at: clock.now) == .seconds(30))
        #expect(tier.timeToLive(lenient, at: clock.now) == .seconds(330))
        // With a validator it stays to be validated: its lifetime again, at least 5 minutes.
        let validated = CacheFixture.entry([("Cache-Control", "max-age=30, must-revalidate"), ("ETag", "\"x\"")], clock: clock)
        #expect(tier.timeToLive(validated, at: clock.now) == .seconds(330))
        let alwaysValidate = CacheFixture.entry([("Cache-Control", "no-cache"), ("ETag", "\"x\"")], clock: clock)
        #expect(tier.willWrite(alwaysValidate, now: clock.now))
        let nothingToKeep = CacheFixture.entry([("Cache-Control", "max-age=0, must-revalidate")], clock: clock)
        #expect(!tier.willWrite(nothingToKeep, now: clock.now))
        await fleet.stop()
    }

    @Test("an unsafe method's invalidation is in Redis before its answer goes out: the next GET, on this replica or a fresh one, goes upstream")
    func invalidationBeforeTheAnswer() async throws {
        let fleet = try await Fleet()
        let a = try fleet.replica(clock: clock)
        let upstream = ScriptedUpstream { n, request in
            CacheFixture.response(headers: [("Cache-Control", "max-age=600")], body: request.method == .put ? "ok" : "v\(n)")
        }
        _ = try await send(a, upstream)
        try await fleet.waitForVariants(1)
        _ = try await send(a, upstream, .put)
        #expect(try await fleet.variants() == 0)  // no waiting: gone when the PUT was answered
        try await fleet.noLeases()
        #expect(try await send(a, upstream).text == "v3")
        await fleet.stop()
    }

    /// A response stored through replica `a` and read by `b` (its memory holds it too); the
    /// upstream answers a `POST` with "ok" and a `GET` with "v" and its count.
    private func storedThroughAThenB(_ fleet: Fleet, _ a: CacheMiddleware, _ b: CacheMiddleware) async throws
        -> (ScriptedUpstream, String) {
        let upstream = ScriptedUpstream { n, request in
            CacheFixture.response(headers: [("Cache-Control", "max-age=600")], body: request.method == .post ? "ok" : "v\(n)")
        }
        _ = try await send(a, upstream)
        try await fleet.waitForVariants(1)
        #expect(try await send(b, upstream).text == "v1")
        return (upstream, CacheMiddleware.key(authority: "api.test", target: "/items/1"))
    }

    /// The running feed waits on the stream (`XREAD BLOCK`): with a minute's block and an hour
    /// between failed reads, only a read that wakes on the event can hear it within the deadline
    /// (a poll every `block` would not), and `stop` ends the blocked read by closing its connection.
    @Test("the running feed hears an invalidation as it is published, and stops at once while it waits")
    func blockingFeed() async throws {
        let fleet = try await Fleet()
        let (a, b) = (try fleet.replica(clock: clock), try fleet.replica(clock: clock))
        let tiers = try #require(b.tiers)
        let feed = CacheInvalidationFeed(tier: tiers.fleet, memory: tiers.memory, metrics: CacheMetrics(cache: "test"),
                                         block: .seconds(60), retryInterval: .seconds(3600), logger: Self.logger)
        feed.start()
        try await Eventually.wait(timeout: .seconds(30), "the feed to find the stream's end") { feed.following }
        let (upstream, key) = try await storedThroughAThenB(fleet, a, b)
        #expect(tiers.memory.variants(for: key).count == 1)
        _ = try await send(a, upstream, .post)
        try await Eventually.wait(timeout: .seconds(30), "B's feed to hear the invalidation") {
            tiers.memory.variants(for: key).isEmpty
        }
        let stopping = ContinuousClock.now
        await feed.stop()
        #expect(stopping.duration(to: .now) < .seconds(30), "stop closed the blocked read, not its 60 s wait")
        await fleet.stop()
    }

    /// Starts from many tasks at once: the server sees one listener connection (the feed's
    /// name), and `stop` closes it. `start` decides and opens under one lock, so a racing call
    /// cannot make a second pool that nobody shuts down.
    @Test("starts racing one another leave one listener connection, and stop closes it")
    func racingStarts() async throws {
        let fleet = try await Fleet()
        let b = try fleet.replica(clock: clock)
        let tiers = try #require(b.tiers)
        let feed = CacheInvalidationFeed(tier: tiers.fleet, memory: tiers.memory, metrics: CacheMetrics(cache: "test"),
                                         block: .seconds(60), retryInterval: .seconds(3600), logger: Self.logger)
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<16 { group.addTask { feed.start() } }
        }
        try await Eventually.wait(timeout: .seconds(30), "the feed to find the stream's end") { feed.following }
        #expect(try await listeners(fleet) == 1)
        await feed.stop()
        try await Eventually.wait(timeout: .seconds(30), "the listener's connection to close") {
            (try? await listeners(fleet)) == 0
        }
        await fleet.stop()
    }

    /// The feed's connections the server knows (`CLIENT LIST`, by the name the feed gives them).
    private func listeners(_ fleet: Fleet) async throws -> Int {
        let list = try await fleet.pool.send(["CLIENT", "LIST"]).string ?? ""
        return list.split(separator: "\n").filter { $0.contains("name=portico-cache-feed ") }.count
    }

    @Test("an invalidation on one replica reaches another's memory through the event stream")
    func invalidationFeed() async throws {
        let fleet = try await Fleet()
        let (a, b) = (try fleet.replica(clock: clock), try fleet.replica(clock: clock))
        let feed = try #require(b.feed)
        await feed.poll()  // starts from the newest event
        let (upstream, key) = try await storedThroughAThenB(fleet, a, b)
        #expect(try #require(b.tiers).memory.variants(for: key).count == 1)

        _ = try await send(a, upstream, .post)
        try await Eventually.wait(timeout: .seconds(30), "B to hear the invalidation") {
            await feed.poll()
            return b.tiers?.memory.variants(for: key).isEmpty == true
        }
        #expect(try await fleet.variants() == 0)
        try await fleet.noLeases()
        #expect(try await send(b, upstream).text == "v3")
        await fleet.stop()
    }
}
