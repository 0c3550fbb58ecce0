/// `random`: a candidate uniformly at random, from the loop's own random state.
struct RandomPolicy: BalancingPolicy {
    static let name = "random"

    func pick(_ candidates: Candidates, row: LoopSlots, columns: [Int], layout: RowLayout, now: Int64) -> Int {
        candidates.index(row.random(below: candidates.count, layout))
    }
}

extension BalanceStrategy {
    public static let random = BalanceStrategy(RandomPolicy.self)
}
