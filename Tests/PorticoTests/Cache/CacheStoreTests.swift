import HTTPTypes
import Portico
import PorticoTesting
import Testing

@Suite("In-memory cache store: LRU by bytes")
struct CacheStoreTests {
    let clock = ManualClock()

    func entry(_ path: String, bytes: Int = 1000, vary: [(String, String)] = [], request: [(String, String)] = []) -> CacheEntry {
        CacheFixture.entry([("Cache-Control", "max-age=60")] + vary, request: request, clock: clock,
                           key: "api.test\u{0}\(path)", body: String(repeating: "x", count: bytes))
    }

    @Test("stays under max_bytes by evicting the least recently used keys")
    func evictsLeastRecentlyUsed() {
        let size = entry("/a").size
        let store = InMemoryCacheStore(maxBytes: size * 3)
        store.insert(entry("/a"))
        store.insert(entry("/b"))
        store.insert(entry("/c"))
        #expect(store.storedBytes == size * 3)
        _ = store.variants(for: "api.test\u{0}/a")  // /a is now the most recently used
        let change = store.insert(entry("/d"))
        #expect(change.evictions == 1)
        #expect(store.variants(for: "api.test\u{0}/b").isEmpty)
        #expect(!store.variants(for: "api.test\u{0}/a").isEmpty)
        #expect(!store.variants(for: "api.test\u{0}/c").isEmpty)
        #expect(store.storedBytes <= size * 3 && store.keyCount == 3)
    }

    @Test("an entry larger than the whole store is refused")
    func tooLarge() {
        let store = InMemoryCacheStore(maxBytes: 2000)
        store.insert(entry("/big", bytes: 5000))
        #expect(store.keyCount == 0 && store.storedBytes == 0)
    }

    @Test("variants: same Vary values replace, others add, at most maxVariants, newest first")
    func variants() {
        let store = InMemoryCacheStore(maxBytes: 1 << 20, maxVariants: 2)
        let vary = [("Vary", "Accept-Encoding")]
        store.insert(entry("/v", vary: vary, request: [("Accept-Encoding", "gzip")]))
        store.insert(entry("/v", vary: vary, request: [("Accept-Encoding", "br")]))
        store.insert(entry("/v", bytes: 10, vary: vary, request: [("Accept-Encoding", "gzip")]))
        var stored = store.variants(for: "api.test\u{0}/v")
        #expect(stored.count == 2)
        #expect(stored.first?.body.readableBytes == 10)
        store.insert(entry("/v", vary: vary, request: [("Accept-Encoding", "zstd")]))
        stored = store.variants(for: "api.test\u{0}/v")
        #expect(stored.map { $0.vary.values } == [["zstd"], ["gzip"]])
        #expect(store.storedBytes == stored.reduce(0) { $0 + $1.size })
    }

    @Test("removeAll drops every variant and frees the bytes; slots are reused")
    func remove() {
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        store.insert(entry("/a"))
        store.insert(entry("/b"))
        store.removeAll(for: "api.test\u{0}/a")
        #expect(store.variants(for: "api.test\u{0}/a").isEmpty)
        #expect(store.storedBytes == entry("/b").size)
        store.insert(entry("/c"))
        #expect(store.keyCount == 2 && !store.variants(for: "api.test\u{0}/c").isEmpty)
        store.removeAll(for: "api.test\u{0}/missing")
        #expect(store.keyCount == 2)
    }

    @Test("many keys churned through a small store stay within bounds")
    func churn() {
        // Paths of one length, so every entry has the same size.
        let size = entry("/1000").size
        let store = InMemoryCacheStore(maxBytes: size * 10)
        var evictions = 0
        for i in 1000..<1500 {
            evictions += store.insert(entry("/\(i)")).evictions
            _ = store.variants(for: "api.test\u{0}/\(1000 + (i - 1000) / 2)")
        }
        #expect(store.keyCount == 10)
        #expect(store.storedBytes == size * 10)
        #expect(evictions == 490)
    }
}

@Suite("Request coalescing and background refreshes")
struct CoalescingTests {
    @Test("the first request leads, later ones follow and get its outcome")
    func leaderAndFollowers() async throws {
        let clock = ManualClock()
        let coalescer = RequestCoalescer(limit: 10)
        guard case .leader(let flight) = coalescer.join("k", at: .now) else { Issue.record("expected leader"); return }
        guard case .follower(let same) = coalescer.join("k", at: .now) else { Issue.record("expected follower"); return }
        #expect(same === flight)
        let waiter = Task { try await same.wait(until: clock.now.advanced(by: .seconds(30)), clock: clock) }
        try await Eventually.wait { flight.waiterCount == 1 }
        coalescer.finish("k", flight, .notShared)
        let outcome = try await waiter.value
        guard case .notShared = outcome else { Issue.record("expected notShared"); return }
        // The key is free again.
        guard case .leader = coalescer.join("k", at: .now) else { Issue.record("expected a new leader"); return }
    }

    @Test("a follower gives up at its own deadline")
    func followerDeadline() async throws {
        let clock = ManualClock()
        let coalescer = RequestCoalescer(limit: 10)
        guard case .leader(let flight) = coalescer.join("k", at: .now) else { Issue.record("expected leader"); return }
        let waiter = Task { try await flight.wait(until: clock.now.advanced(by: .seconds(2)), clock: clock) }
        await clock.waitForSleepers(1)
        clock.advance(by: .seconds(2))
        await #expect(throws: GatewayError.self) { try await waiter.value }
        try await Eventually.wait { flight.waiterCount == 0 }
        coalescer.finish("k", flight, .notShared)
    }

    @Test("a cancelled follower stops waiting")
    func followerCancelled() async throws {
        let clock = ManualClock()
        let coalescer = RequestCoalescer(limit: 10)
        guard case .leader(let flight) = coalescer.join("k", at: .now) else { Issue.record("expected leader"); return }
        let waiter = Task { try await flight.wait(until: clock.now.advanced(by: .seconds(30)), clock: clock) }
        try await Eventually.wait { flight.waiterCount == 1 }
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        #expect(flight.waiterCount == 0)
    }

    @Test("after an uncacheable answer the key is passed through without waiting, for a while")
    func hitForPass() {
        let coalescer = RequestCoalescer(limit: 10, passDuration: .seconds(10))
        let start = ContinuousClock.now
        guard case .leader(let flight) = coalescer.join("k", at: start) else { Issue.record("expected leader"); return }
        coalescer.finish("k", flight, .notShared, uncacheableAt: start)
        guard case .alone = coalescer.join("k", at: start.advanced(by: .seconds(9))) else { Issue.record("expected alone"); return }
        guard case .leader = coalescer.join("k", at: start.advanced(by: .seconds(10))) else { Issue.record("expected leader again"); return }
    }

    @Test("the table is bounded: past the limit requests go alone")
    func bounded() {
        let coalescer = RequestCoalescer(limit: 2)
        _ = coalescer.join("a", at: .now)
        _ = coalescer.join("b", at: .now)
        guard case .alone = coalescer.join("c", at: .now) else { Issue.record("expected alone"); return }
        #expect(coalescer.inFlight == 2)
    }

    @Test("background refreshes: one per key, bounded, cancelled by shutdown")
    func refresher() async throws {
        let refresher = BackgroundRefresher(limit: 2)
        let clock = ManualClock()
        #expect(refresher.start("a") { try? await clock.sleep(for: .seconds(3600)) })
        #expect(!refresher.start("a") { })
        #expect(refresher.start("b") { try? await clock.sleep(for: .seconds(3600)) })
        #expect(!refresher.start("c") { })
        #expect(refresher.running == 2)
        await refresher.shutdown()
        #expect(refresher.running == 0)
        #expect(!refresher.start("d") { })
    }
}

extension CacheStoreTests {
    /// Hits are served from a per-thread front (issue #33): it must never serve what the store
    /// no longer holds, nor miss what it now holds.
    @Test("a thread's front never outlives a change: removed keys miss, stored keys hit, on every thread")
    func frontsFollowChanges() async {
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let key = "api.test\u{0}/hot"
        #expect(store.variants(for: key).isEmpty)
        store.insert(entry("/hot"))
        #expect(store.variants(for: key).count == 1)
        #expect(store.variants(for: key).count == 1)
        store.removeAll(for: key)
        #expect(store.variants(for: key).isEmpty)
        store.insert(entry("/hot"))
        store.insert(entry("/other"))
        #expect(store.variants(for: key).count == 1)

        // Many threads hitting one key while it is removed and stored again: once the writer
        // has finished (the key removed last), no reader sees it any more.
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    for _ in 0..<2_000 { _ = store.variants(for: key) }
                }
            }
            group.addTask {
                for _ in 0..<200 {
                    store.removeAll(for: key)
                    store.insert(self.entry("/hot"))
                }
                store.removeAll(for: key)
            }
        }
        await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<8 { group.addTask { store.variants(for: key).isEmpty } }
            for await empty in group { #expect(empty) }
        }
    }
}
