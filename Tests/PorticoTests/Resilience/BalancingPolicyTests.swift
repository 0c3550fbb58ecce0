@testable import Portico
import Testing

/// Each balancing policy as a value: candidates in, an index out, only its loop's row written.
@Suite("Resilience: balancing policies")
struct BalancingPolicyTests {
    /// A loop's row for `columns` endpoints (identity columns unless given), laid out for `policy`.
    struct Row {
        let slots: LoopSlots
        let columns: [Int]
        let layout: RowLayout

        /// Every word of the row.
        var words: [Int] { (0..<layout.width).map(slots.load) }

        func pick(_ policy: any BalancingPolicy, _ candidates: Candidates, now: Int64 = 0) -> Int {
            policy.pick(candidates, row: slots, columns: columns, layout: layout, now: now)
        }
    }

    static func row(_ policy: any BalancingPolicy.Type, columns: Int = 3, map: [Int]? = nil, seed: Int = 88_172_645_463_325_252) -> Row {
        let layout = RowLayout(columns: columns, stateWords: policy.stateWords, columnWords: policy.columnWords)
        let slots = layout.makeRow()
        slots.store(layout.randomSlot, seed)
        return Row(slots: slots, columns: map ?? Array(0..<columns), layout: layout)
    }

    @Test("the registry lists round_robin (the default), least_request, random and ewma, and each word makes its policy")
    func registry() {
        #expect(BalanceStrategy.allCases.map(\.rawValue) == ["round_robin", "least_request", "random", "ewma"])
        #expect(BalanceStrategy.allCases == [.roundRobin, .leastRequest, .random, .ewma])
        #expect(UpstreamConfig(name: "u", url: .init(string: "http://x")!).balance == .roundRobin)
        for strategy in BalanceStrategy.allCases {
            #expect(type(of: strategy.makePolicy()).name == strategy.rawValue)
            #expect(BalanceStrategy(rawValue: strategy.rawValue) == strategy)
        }
        #expect(BalanceStrategy(rawValue: "peak_ewma") == nil)
        #expect(BalancingPolicies.schemaDescription
            == "How an endpoint is picked: round_robin (default), least_request (power of two choices), random or ewma (peak EWMA of latency × requests in flight, power of two choices).")
    }

    @Test("Candidates: the nth set bit, lowest first")
    func candidates() {
        let candidates = Candidates(mask: 0b1011_0100)
        #expect(candidates.count == 4)
        #expect((0..<4).map(candidates.index) == [2, 4, 5, 7])
    }

    @Test("round_robin takes the candidates in turn, each loop on its own turn")
    func roundRobin() {
        let policy = RoundRobinPolicy()
        let row = Self.row(RoundRobinPolicy.self)
        let all = Candidates(mask: 0b111)
        #expect((0..<7).map { _ in row.pick(policy, all) } == [0, 1, 2, 0, 1, 2, 0])
        // The turn (7 now) goes on over whichever candidates there are.
        let two = Candidates(mask: 0b101)
        #expect((0..<4).map { _ in row.pick(policy, two) } == [2, 0, 2, 0])
        // Another loop's row has its own turn: this one's picks never moved it.
        let other = Self.row(RoundRobinPolicy.self)
        #expect(other.pick(policy, all) == 0)
        var counts = [0, 0, 0]
        for _ in 0..<300 { counts[row.pick(policy, all)] += 1 }
        // (300 picks from any turn: 100 each.)
        #expect(counts == [100, 100, 100])
        // It writes its turn and nothing else: not the in-flight columns, not the random state.
        let before = row.words
        _ = row.pick(policy, all)
        let after = row.words
        #expect(Array(after.prefix(3)) == Array(before.prefix(3)))
        #expect(after[row.layout.randomSlot] == before[row.layout.randomSlot])
        #expect(after[3] == before[3] &+ 1)
    }

    @Test("random picks only candidates, about evenly, from the row's own state")
    func random() {
        let policy = RandomPolicy()
        #expect(RandomPolicy.stateWords == 0)
        let row = Self.row(RandomPolicy.self, columns: 4)
        let candidates = Candidates(mask: 0b1011)
        var counts = [0, 0, 0, 0]
        for _ in 0..<3000 { counts[row.pick(policy, candidates)] += 1 }
        #expect(counts[2] == 0, "\(counts)")
        #expect([counts[0], counts[1], counts[3]].allSatisfy { $0 > 800 }, "\(counts)")
        // The same state gives the same picks: nothing but the row decides.
        let a = Self.row(RandomPolicy.self, seed: 12345), b = Self.row(RandomPolicy.self, seed: 12345)
        let all = Candidates(mask: 0b111)
        #expect((0..<20).map { _ in a.pick(policy, all) } == (0..<20).map { _ in b.pick(policy, all) })
        // It writes its random state only.
        let before = row.words
        _ = row.pick(policy, candidates)
        let after = row.words
        #expect(Array(after.prefix(4)) == Array(before.prefix(4)))
        #expect(after[row.layout.randomSlot] != before[row.layout.randomSlot])
    }

    @Test("least_request: of two drawn at random, the one with fewer requests in flight on this loop")
    func leastRequest() {
        let policy = LeastRequestPolicy()
        // Two candidates: always the idler one.
        let two = Self.row(LeastRequestPolicy.self, columns: 2)
        two.slots.store(0, 9)
        #expect((0..<50).allSatisfy { _ in two.pick(policy, Candidates(mask: 0b11)) == 1 })
        // Three: the busiest never wins a draw of two distinct ones; the idlest wins two pairs in three.
        let three = Self.row(LeastRequestPolicy.self)
        for (column, count) in [9, 1, 5].enumerated() { three.slots.store(column, count) }
        var counts = [0, 0, 0]
        for _ in 0..<3000 { counts[three.pick(policy, Candidates(mask: 0b111))] += 1 }
        #expect(counts[0] == 0, "\(counts)")
        #expect(counts[1] > 1800 && counts[2] > 800, "\(counts)")
        // The counts are read at the endpoints' columns (a resolved upstream's are not their indices).
        let mapped = Self.row(LeastRequestPolicy.self, columns: 6, map: [5, 2])
        mapped.slots.store(5, 0)
        mapped.slots.store(2, 7)
        mapped.slots.store(0, 100)
        #expect((0..<50).allSatisfy { _ in mapped.pick(policy, Candidates(mask: 0b11)) == 0 })
        // It reads the counts and writes only its random state.
        let before = three.words
        _ = three.pick(policy, Candidates(mask: 0b111))
        let after = three.words
        #expect(Array(after.prefix(3)) == [9, 1, 5])
        #expect(after[three.layout.randomSlot] != before[three.layout.randomSlot])
    }
}
