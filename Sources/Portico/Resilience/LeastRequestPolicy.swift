/// `least_request`: power of two choices. Two candidates at random, the one with fewer requests in
/// flight *on this loop* (ties to the first drawn). The counts are per loop (the row's columns),
/// never one counter shared between cores; each loop balances its own traffic.
struct LeastRequestPolicy: BalancingPolicy {
    static let name = "least_request"
    static let summary: String? = "power of two choices"

    func pick(_ candidates: Candidates, row: LoopSlots, columns: [Int], layout: RowLayout, now: Int64) -> Int {
        let count = candidates.count
        let first = row.random(below: count, layout)
        var second = row.random(below: count - 1, layout)
        if second >= first { second += 1 }
        let a = candidates.index(first), b = candidates.index(second)
        return row.inFlight(column: columns[b]) < row.inFlight(column: columns[a]) ? b : a
    }
}

extension BalanceStrategy {
    public static let leastRequest = BalanceStrategy(LeastRequestPolicy.self)
}
