import Foundation
import HTTPTypes
import LockAudit
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// What the cache passes through (issue #42) — keys never stored, keys whose responses cannot be
/// stored — takes no lock that another thread takes, and still answers exactly.
@Suite("Cache pass-through: no shared lock")
struct CachePassThroughTests {
    let clock = ManualClock()

    func entry(_ path: String, bytes: Int = 100) -> CacheEntry {
        CacheFixture.entry([("Cache-Control", "max-age=60")], clock: clock, key: "api.test\u{0}\(path)",
                           body: String(repeating: "x", count: bytes))
    }

    /// The ids of `count` threads running `body` together (alive together, so all distinct).
    static func threads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) -> Set<UInt> {
        let ids = Mutex<Set<UInt>>([])
        ShardedMetricsTests.onThreads(count, warmUp: { _ in ids.withLock { _ = $0.insert(LockAudit.currentThread) } }, body)
        return ids.withLock { $0 }
    }

    static func locks(at file: String, takenBy threads: Set<UInt>) -> [String: Int] {
        var taken: [String: Int] = [:]
        for instance in LockAudit.report() where instance.site.file.hasSuffix(file) {
            for (thread, count) in instance.threads where threads.contains(thread) {
                taken[instance.site.description, default: 0] += count
            }
        }
        return taken
    }

    @Test("lookups and invalidations of keys never stored take no store lock on any thread; lookups of a stored key do")
    func neverStoredKeysTakeNoLock() {
        LockAudit.whileRecording {
            let store = InMemoryCacheStore(maxBytes: 1 << 20)
            store.insert(entry("/stored"))
            // Keys outside the stored key's presence bucket: the filter is exact only there, and
            // String hashes are seeded per process, so a fixed list shares it in ~5 % of runs
            // (then its first lookup on each thread takes the lock, as it must).
            let mask = KeyPresence.buckets(forMaxBytes: 1 << 20) - 1
            let storedBucket = "api.test\u{0}/stored".hashValue & mask
            let never = (0..<200).map { "api.test\u{0}/never/\($0)" }.filter { $0.hashValue & mask != storedBucket }
            let lookups = Array(never.prefix(50)), removals = Array(never.suffix(4))
            let passing = Self.threads(4) { thread in
                for index in 0..<5_000 {
                    #expect(store.variants(for: lookups[index % lookups.count]).isEmpty)
                    if index % 10 == 0 { store.removeAll(for: removals[thread]) }
                }
            }
            #expect(Self.locks(at: "/CacheStore.swift", takenBy: passing).isEmpty)
            // The same store's lock, seen by the audit on threads that look up what it holds:
            // the check above can fail.
            let hitting = Self.threads(4) { _ in
                for _ in 0..<100 { #expect(store.variants(for: "api.test\u{0}/stored").count == 1) }
            }
            #expect(!Self.locks(at: "/CacheStore.swift", takenBy: hitting).isEmpty)
        }
    }

    @Test("with far more keys stored than presence buckets, every stored key is found and every removed one misses")
    func presenceIsExactWhenCrowded() {
        // 4 MiB: the fewest buckets (1,024), and room for all 3,000 keys.
        let store = InMemoryCacheStore(maxBytes: 4 << 20)
        let paths = (0..<3_000).map { "/k/\($0)" }
        for path in paths { store.insert(entry(path, bytes: 10)) }
        #expect(store.keyCount == paths.count)
        for (index, path) in paths.enumerated() where index % 2 == 0 { store.removeAll(for: "api.test\u{0}\(path)") }
        for (index, path) in paths.enumerated() {
            #expect(store.variants(for: "api.test\u{0}\(path)").isEmpty == (index % 2 == 0), "\(path)")
        }
        // Evicted keys leave the filter too: a store of 10 entries, churned.
        let size = entry("/c/1000", bytes: 10).size
        let small = InMemoryCacheStore(maxBytes: size * 10)
        for index in 1000..<1500 { small.insert(entry("/c/\(index)", bytes: 10)) }
        #expect(small.keyCount == 10)
        let found = (1000..<1500).filter { !small.variants(for: "api.test\u{0}/c/\($0)").isEmpty }
        #expect(found == Array(1490..<1500))
    }

    @Test("an unchanged invalidation records no metric change")
    func unchangedInvalidation() {
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        store.insert(entry("/a"))
        #expect(!store.removeAll(for: "api.test\u{0}/missing").changed)
        let removed = store.removeAll(for: "api.test\u{0}/a")
        #expect(removed.changed && removed.storedBytes == 0)
        #expect(!store.removeAll(for: "api.test\u{0}/a").changed)
    }

    @Test("a key marked uncacheable goes alone without the coalescer's lock on any thread; an unmarked key takes it")
    func markedKeysTakeNoLock() {
        LockAudit.whileRecording {
            let coalescer = RequestCoalescer(limit: 10, passDuration: .seconds(10))
            let t0 = ContinuousClock.now
            guard case .leader(let flight) = coalescer.join("k", at: t0) else { Issue.record("expected leader"); return }
            coalescer.finish("k", flight, .notShared, uncacheableAt: t0)
            let passing = Self.threads(4) { _ in
                for index in 0..<5_000 {
                    let now = t0.advanced(by: .microseconds(index * 100))
                    guard case .alone = coalescer.join("k", at: now) else { Issue.record("expected alone"); return }
                    coalescer.passed("k", uncacheableAt: now)
                }
            }
            #expect(Self.locks(at: "/RequestCoalescer.swift", takenBy: passing).isEmpty)
            let joining = Self.threads(2) { thread in
                guard case .leader(let flight) = coalescer.join("other\(thread)", at: t0) else { Issue.record("expected leader"); return }
                coalescer.finish("other\(thread)", flight, .notShared)
            }
            #expect(!Self.locks(at: "/RequestCoalescer.swift", takenBy: joining).isEmpty)
        }
    }

    @Test("requests that pass renew the mark once less than half of it is left, so it never lapses under traffic")
    func passingRenewsTheMark() {
        let t0 = ContinuousClock.now
        let coalescer = RequestCoalescer(limit: 10, passDuration: .seconds(10))
        guard case .leader(let flight) = coalescer.join("k", at: t0) else { Issue.record("expected leader"); return }
        coalescer.finish("k", flight, .notShared, uncacheableAt: t0)
        // 4 s in, 6 s are left: not renewed, the mark lapses at 10 s.
        coalescer.passed("k", uncacheableAt: t0.advanced(by: .seconds(4)))
        guard case .alone = coalescer.join("k", at: t0.advanced(by: .milliseconds(9_990))) else { Issue.record("expected alone"); return }
        guard case .leader(let second) = coalescer.join("k", at: t0.advanced(by: .seconds(10))) else {
            Issue.record("expected a leader once the mark lapsed"); return
        }
        coalescer.finish("k", second, .notShared, uncacheableAt: t0.advanced(by: .seconds(10)))
        // 16 s in, 4 s are left: renewed until 26 s.
        coalescer.passed("k", uncacheableAt: t0.advanced(by: .seconds(16)))
        guard case .alone = coalescer.join("k", at: t0.advanced(by: .milliseconds(25_990))) else { Issue.record("expected alone"); return }
        guard case .leader = coalescer.join("k", at: t0.advanced(by: .seconds(26))) else { Issue.record("expected leader"); return }
        // A request that went alone for another reason (a full table) marks its key too.
        coalescer.passed("fresh", uncacheableAt: t0)
        guard case .alone = coalescer.join("fresh", at: t0.advanced(by: .seconds(1))) else { Issue.record("expected alone"); return }
    }

    @Test("a mark is its key's own: another key of the same slot is not passed")
    func marksAreTagged() throws {
        // 64 slots (the fewest): find a key in the marked key's slot with another tag.
        let coalescer = RequestCoalescer(limit: 1, passDuration: .seconds(10))
        let marked = "k"
        let slot = marked.hashValue & 63, tag = marked.hashValue >> 40
        var found: String?
        for index in 0..<100_000 where found == nil {
            let candidate = "other\(index)"
            let hash = candidate.hashValue
            if hash & 63 == slot && hash >> 40 != tag { found = candidate }
        }
        let other = try #require(found)
        let t0 = ContinuousClock.now
        coalescer.passed(marked, uncacheableAt: t0)
        guard case .alone = coalescer.join(marked, at: t0) else { Issue.record("expected alone"); return }
        guard case .leader = coalescer.join(other, at: t0) else { Issue.record("expected leader for \(other)"); return }
    }
}
