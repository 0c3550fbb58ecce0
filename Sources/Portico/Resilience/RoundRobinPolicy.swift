/// `round_robin` (the default): the candidates in turn. Each loop keeps its own turn (one word of
/// its row), so no core writes another's; the spread is even per loop, and so over all of them.
struct RoundRobinPolicy: BalancingPolicy {
    static let name = "round_robin"
    static let summary: String? = "default"
    static let stateWords = 1

    func pick(_ candidates: Candidates, row: LoopSlots, columns: [Int], layout: RowLayout, now: Int64) -> Int {
        let turn = row.policyWord(0, layout)
        row.setPolicyWord(0, turn &+ 1, layout)
        return candidates.index(Int(UInt(bitPattern: turn) % UInt(candidates.count)))
    }
}

extension BalanceStrategy {
    public static let roundRobin = BalanceStrategy(RoundRobinPolicy.self)
}
