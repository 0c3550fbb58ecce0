import Portico
import PorticoTesting
import Synchronization
import Testing

/// Hands out 0, 1, 2, … to any number of threads.
final class StepCounter: Sendable {
    private let value = Atomic<Int>(0)
    func next() -> Int { value.wrappingAdd(1, ordering: .relaxed).oldValue }
}

@Suite("Rate limit: token buckets and memory")
struct RateLimitStoreTests {
    let t0 = ContinuousClock.now

    @Test("a rested key gets its burst, then one request per refill interval")
    func burstThenRefill() {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 2, burst: 3), maxKeys: 100)
        let decisions = (0..<4).map { _ in store.take("a", at: t0) }
        #expect(decisions.map(\.allowed) == [true, true, true, false])
        #expect(decisions.map(\.remaining) == [2, 1, 0, 0])
        #expect(decisions[3].retryAfter == .milliseconds(500))
        #expect(decisions[2].resetAfter == .milliseconds(1500))
        // Half a second refills one token.
        #expect(!store.take("a", at: t0.advanced(by: .milliseconds(400))).allowed)
        #expect(store.take("a", at: t0.advanced(by: .milliseconds(500))).allowed)
        #expect(!store.take("a", at: t0.advanced(by: .milliseconds(500))).allowed)
        // Refill never exceeds the burst.
        let later = t0.advanced(by: .seconds(60))
        #expect((0..<4).map { _ in store.take("a", at: later).allowed } == [true, true, true, false])
    }

    @Test("keys have separate buckets")
    func separateKeys() {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 1, burst: 1), maxKeys: 100)
        #expect(store.take("a", at: t0).allowed)
        #expect(!store.take("a", at: t0).allowed)
        #expect(store.take("b", at: t0).allowed)
    }

    @Test("a clock read behind another never grants an extra token: the bucket is seen as of the earlier instant")
    func outOfOrderInstants() {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 1, burst: 2), maxKeys: 100)
        #expect(store.take("a", at: t0.advanced(by: .milliseconds(10))).allowed)
        #expect(store.take("a", at: t0.advanced(by: .milliseconds(10))).allowed)
        // Two tokens gone as of t0+10ms; a thread whose clock read says t0 sees no more.
        #expect(!store.take("a", at: t0).allowed)
        // The next token is due one interval after the first was taken: t0+1.01s.
        #expect(!store.take("a", at: t0.advanced(by: .milliseconds(1009))).allowed)
        #expect(store.take("a", at: t0.advanced(by: .milliseconds(1010))).allowed)
    }

    @Test("waiting: reservations come out in order, one interval apart, never more than the rate")
    func reservationsInOrder() {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 10, burst: 2), maxKeys: 100)
        let decisions = (0..<6).map { _ in store.take("k", at: t0, maxWait: .milliseconds(350)) }
        #expect(decisions.map(\.allowed) == [true, true, true, true, true, false])
        #expect(decisions.map(\.wait) == [.zero, .zero, .milliseconds(100), .milliseconds(200), .milliseconds(300), .zero])
        // The refused one is told when a token could be had: after the three reserved.
        #expect(decisions[5].retryAfter == .milliseconds(400))
        // A reservation given back (its client left) is the next newcomer's.
        store.giveBack("k", at: t0)
        #expect(store.take("k", at: t0, maxWait: .milliseconds(350)).wait == .milliseconds(300))
    }

    @Test("8 threads offering twice the rate over a simulated 10 s run: accepted is burst + rate × time, within a token or two")
    func concurrentOverloadIsExact() async {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 500, burst: 50), maxKeys: 100)
        let t0 = self.t0
        // One simulated clock for all threads: each request takes the next millisecond (1,000/s offered).
        let steps = StepCounter()
        let accepted = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var accepted = 0
                    while true {
                        let step = steps.next()
                        guard step < 10_000 else { return accepted }
                        if store.take("hot", at: t0.advanced(by: .milliseconds(step))).allowed { accepted += 1 }
                    }
                }
            }
            return await group.reduce(0, +)
        }
        // 50 at once, then 500/s for 9.999 s = 5,049, never more. A thread preempted between its
        // clock read and its take takes as of an earlier instant (and may be refused); only the
        // tokens of the run's last moments can go unclaimed that way. (The bound: ±5 %.)
        #expect(accepted <= 5_050 && accepted >= 5_049 - 25, "accepted \(accepted)")
    }

    @Test("accepted count over a long simulated run matches rate × time + burst")
    func longRunRate() {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 100, burst: 100), maxKeys: 10)
        var accepted = 0
        // 1000 requests/s offered for 10 s, in 1 ms steps.
        for ms in 0..<10_000 where store.take("k", at: t0.advanced(by: .milliseconds(ms))).allowed {
            accepted += 1
        }
        #expect(accepted >= 1_095 && accepted <= 1_100)   // 100 burst + 100/s × 9.999 s
    }

    @Test("1,000,000 distinct keys keep the store within max_keys")
    func memoryBound() async {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 1, burst: 5), maxKeys: 1_000)
        for i in 0..<1_000_000 {
            _ = store.take(String(i), at: t0)
            if i % 10_000 == 0 { await Task.yield() }  // let the parallel tests have the shared threads
        }
        #expect(store.count <= 1_000)
        #expect(store.count > 0)
    }

    @Test("idle buckets expire: a refilled bucket is forgotten")
    func idleExpiry() {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 10, burst: 10), maxKeys: 10_000, shards: 1)
        for i in 0..<500 { _ = store.take("k\(i)", at: t0) }
        #expect(store.count == 500)
        // Every bucket is full again after 1 s; the next request sweeps them.
        _ = store.take("fresh", at: t0.advanced(by: .seconds(2)))
        #expect(store.count == 1)
    }

    @Test("a full shard drops refilled buckets before recently used ones")
    func evictionPrefersRefilled() {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 1, burst: 10), maxKeys: 4, shards: 1)
        _ = store.take("old", at: t0)                          // refilled by t0+2s
        for _ in 0..<10 { _ = store.take("busy", at: t0.advanced(by: .seconds(1))) }   // empty
        _ = store.take("c", at: t0.advanced(by: .milliseconds(1500)))
        _ = store.take("d", at: t0.advanced(by: .milliseconds(1500)))
        #expect(store.count == 4)
        _ = store.take("e", at: t0.advanced(by: .seconds(2)))  // full shard: evict
        #expect(store.count <= 4)
        // "busy" kept its bucket: one token refilled since t0+1s, not a fresh burst of 10.
        #expect(store.take("busy", at: t0.advanced(by: .seconds(2))).remaining == 0)
    }

    @Test("concurrent takes never grant more than the burst")
    func concurrent() async {
        let store = InMemoryRateLimitStore(policy: TokenBucketPolicy(ratePerSecond: 0.001, burst: 500), maxKeys: 100)
        let t0 = self.t0
        let granted = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask { (0..<200).reduce(0) { sum, _ in sum + (store.take("shared", at: t0).allowed ? 1 : 0) } }
            }
            return await group.reduce(0, +)
        }
        #expect(granted == 500)
    }
}
