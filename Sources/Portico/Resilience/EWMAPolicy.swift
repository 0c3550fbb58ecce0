/// `ewma`: peak EWMA of latency × (requests in flight + 1), power of two choices (linkerd2-proxy's
/// default balancer). Two candidates at random; the cheaper by `PeakEWMA.cost` wins (ties to the
/// one with fewer in flight, then the first drawn).
///
/// Each loop keeps its own estimate of each endpoint (two words per column of its row: the
/// estimate and the instant of its last sample) from the answers its own requests got, so a
/// success writes its own loop's row and nothing another core reads on its path. A loop that
/// has not heard from an endpoint yet tries it.
struct EWMAPolicy: BalancingPolicy {
    static let name = "ewma"
    static let summary: String? = "peak EWMA of latency × requests in flight, power of two choices"
    static let columnWords = 2

    func pick(_ candidates: Candidates, row: LoopSlots, columns: [Int], layout: RowLayout, now: Int64) -> Int {
        let count = candidates.count
        let first = row.random(below: count, layout)
        var second = row.random(below: count - 1, layout)
        if second >= first { second += 1 }
        let a = candidates.index(first), b = candidates.index(second)
        let (costA, inFlightA) = cost(column: columns[a], row: row, layout: layout, now: now)
        let (costB, inFlightB) = cost(column: columns[b], row: row, layout: layout, now: now)
        if costB < costA { return b }
        if costB == costA && inFlightB < inFlightA { return b }
        return a
    }

    func observe(latency: Int64, column: Int, row: LoopSlots, layout: RowLayout, at now: Int64) {
        let estimate = row.columnWord(0, of: column, layout), last = row.columnWord(1, of: column, layout)
        let updated = PeakEWMA.update(estimate: Int64(estimate), lastSample: Int64(last), sample: latency, now: now)
        row.setColumnWord(0, of: column, Int(updated), layout)
        row.setColumnWord(1, of: column, Int(now), layout)
    }

    @inline(__always)
    private func cost(column: Int, row: LoopSlots, layout: RowLayout, now: Int64) -> (Double, Int) {
        let estimate = Int64(row.columnWord(0, of: column, layout))
        let inFlight = row.inFlight(column: column)
        let current = PeakEWMA.current(estimate: estimate, lastSample: Int64(row.columnWord(1, of: column, layout)), now: now)
        return (PeakEWMA.cost(estimate: current, sampled: estimate > 0, inFlight: inFlight), inFlight)
    }
}

extension BalanceStrategy {
    public static let ewma = BalanceStrategy(EWMAPolicy.self)
}
