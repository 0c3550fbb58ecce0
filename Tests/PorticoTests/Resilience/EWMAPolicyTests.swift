@testable import Portico
import Testing

/// `balance: ewma`: the peak EWMA estimator as pure arithmetic, and the policy on a loop's row,
/// with time given in nanoseconds by the test (no clock, no sockets).
@Suite("Resilience: peak EWMA")
struct EWMAPolicyTests {
    static let ms: Int64 = 1_000_000
    static let halfLife = PeakEWMA.halfLife

    @Test("a sample above the estimate replaces it; one below pulls it down by the half-life's weight")
    func peakAndDecay() {
        // The first sample is the estimate.
        #expect(PeakEWMA.update(estimate: 0, lastSample: 0, sample: 10 * Self.ms, now: 0) == 10 * Self.ms)
        // A peak replaces it at once, however little time passed.
        #expect(PeakEWMA.update(estimate: 10 * Self.ms, lastSample: 0, sample: 50 * Self.ms, now: 1) == 50 * Self.ms)
        // A lower sample one half-life later: halfway between.
        #expect(PeakEWMA.update(estimate: 50 * Self.ms, lastSample: 0, sample: 10 * Self.ms, now: Self.halfLife) == 30 * Self.ms)
        // At the same instant it moves nothing; after many half-lives, nearly all the way.
        #expect(PeakEWMA.update(estimate: 50 * Self.ms, lastSample: 7, sample: 10 * Self.ms, now: 7) == 50 * Self.ms)
        let later = PeakEWMA.update(estimate: 50 * Self.ms, lastSample: 0, sample: 10 * Self.ms, now: 20 * Self.halfLife)
        #expect(later > 10 * Self.ms && later < 10 * Self.ms + Self.ms / 1000)
        // Fast samples in quick succession: one slow answer is not forgotten after one fast one.
        var estimate = PeakEWMA.update(estimate: 2 * Self.ms, lastSample: 0, sample: 100 * Self.ms, now: 0)
        var now: Int64 = 0
        for _ in 0..<10 {
            now += 10 * Self.ms
            estimate = PeakEWMA.update(estimate: estimate, lastSample: now - 10 * Self.ms, sample: 2 * Self.ms, now: now)
        }
        #expect(estimate > 90 * Self.ms, "\(estimate)")
    }

    @Test("read, an estimate decays towards zero since its last sample; none reads as none")
    func readDecay() {
        #expect(PeakEWMA.current(estimate: 0, lastSample: 0, now: 99) == 0)
        #expect(PeakEWMA.current(estimate: 40 * Self.ms, lastSample: 5, now: 5) == Double(40 * Self.ms))
        #expect(PeakEWMA.current(estimate: 40 * Self.ms, lastSample: 0, now: 2 * Self.halfLife) == Double(10 * Self.ms))
        // Time running backwards (a clock read on another loop) changes nothing.
        #expect(PeakEWMA.current(estimate: 40 * Self.ms, lastSample: 100, now: 0) == Double(40 * Self.ms))
    }

    @Test("cost: estimate × (in flight + 1); an endpoint without a sample is free until one request is out, then last")
    func cost() {
        #expect(PeakEWMA.cost(estimate: 10, sampled: true, inFlight: 0) == 10)
        #expect(PeakEWMA.cost(estimate: 10, sampled: true, inFlight: 3) == 40)
        #expect(PeakEWMA.cost(estimate: 0, sampled: false, inFlight: 0) == 0)
        #expect(PeakEWMA.cost(estimate: 0, sampled: false, inFlight: 1) == .infinity)
    }

    /// A row for two (or more) endpoints laid out for `ewma`.
    static func row(columns: Int = 2) -> BalancingPolicyTests.Row {
        BalancingPolicyTests.row(EWMAPolicy.self, columns: columns)
    }

    static func observe(_ row: BalancingPolicyTests.Row, column: Int, ms latency: Int64, at now: Int64) {
        EWMAPolicy().observe(latency: latency * Self.ms, column: column, row: row.slots, layout: row.layout, at: now)
    }

    @Test("two endpoints, one 30 ms slower: the fast one takes nearly everything while its queue stays short")
    func slowEndpointShare() {
        let policy = EWMAPolicy()
        let row = Self.row()
        let both = Candidates(mask: 0b11)
        // Neither sampled: the first is tried, then (it has one out) the other.
        #expect(row.pick(policy, both) == 0)
        row.slots.add(0, 1)
        #expect(row.pick(policy, both) == 1)
        row.slots.add(0, -1)
        Self.observe(row, column: 0, ms: 2, at: 0)
        Self.observe(row, column: 1, ms: 32, at: 0)
        // With up to 3 of its own in flight the fast one is still cheaper: 2 × 4 < 32.
        for inFlight in 0...3 {
            row.slots.store(0, inFlight)
            #expect((0..<20).allSatisfy { _ in row.pick(policy, both, now: Self.ms) == 0 })
        }
        // Past 15 in flight it costs more than the idle slow one: the slow one takes the overflow.
        row.slots.store(0, 16)
        #expect(row.pick(policy, both, now: Self.ms) == 1)
        // The slow one's estimate, unrefreshed, decays while the fast one's is kept fresh: after
        // five half-lives (32 ms → 1 ms) it is tried again, and measured anew.
        row.slots.store(0, 0)
        Self.observe(row, column: 0, ms: 2, at: 5 * Self.halfLife)
        #expect(row.pick(policy, both, now: 3 * Self.halfLife) == 0)
        #expect(row.pick(policy, both, now: 5 * Self.halfLife) == 1)
    }

    @Test("it picks only among candidates and writes only its row's words: estimates on observe, random state on pick")
    func writesOwnRow() {
        let policy = EWMAPolicy()
        let row = Self.row(columns: 3)
        #expect(row.layout.width == 3 + 3 * 2 + 1)
        for column in 0..<3 { Self.observe(row, column: column, ms: Int64(column + 1), at: 0) }
        let before = row.words
        var counts = [0, 0, 0]
        for _ in 0..<300 { counts[row.pick(policy, Candidates(mask: 0b110), now: 0)] += 1 }
        #expect(counts[0] == 0)
        // Endpoint 1 (2 ms) beats endpoint 2 (3 ms) at equal load in every draw.
        #expect(counts == [0, 300, 0])
        let after = row.words
        #expect(Array(after.prefix(9)) == Array(before.prefix(9)))
        #expect(after[row.layout.randomSlot] != before[row.layout.randomSlot])
        // Observing writes the endpoint's own two words.
        Self.observe(row, column: 2, ms: 9, at: 5)
        #expect(row.slots.columnWord(0, of: 2, row.layout) == Int(9 * Self.ms))
        #expect(row.slots.columnWord(1, of: 2, row.layout) == 5)
        #expect(row.slots.columnWord(0, of: 1, row.layout) == Int(2 * Self.ms))
    }
}
