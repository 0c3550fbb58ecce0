/// One way of picking an endpoint for an attempt (`upstreams.NAME.balance`). Each policy is one
/// type in its own file (`RoundRobinPolicy.swift`, …) and one entry in `BalancingPolicies.standard`.
///
/// A pick runs on the request's event loop and may write only that loop's row (`LoopSlots`, laid
/// out by `RowLayout`): its own words and its random state, which no other loop writes. It reads
/// the loop's own counts of requests in flight, never a count another core keeps.
protocol BalancingPolicy: Sendable {
    /// The `balance:` word.
    static var name: String { get }
    /// What the configuration reference says of it, in brackets after its word (`nil`: nothing).
    static var summary: String? { get }
    /// Words of its own it keeps in each loop's row (a turn, …).
    static var stateWords: Int { get }
    /// Words of its own it keeps per endpoint column in each loop's row (`ewma`: an estimate and
    /// its instant). A reload that keeps an endpoint keeps them when the policy stays the same.
    static var columnWords: Int { get }

    init()

    /// The index (in the upstream's endpoint set) of one of `candidates`, which are two or more.
    /// `row`: the calling loop's; `columns`: each endpoint's column in it (its requests in flight);
    /// `now`: nanoseconds on the upstream's clock (`OutlierDetector.moment`).
    func pick(_ candidates: Candidates, row: LoopSlots, columns: [Int], layout: RowLayout, now: Int64) -> Int

    /// An attempt on the endpoint of `column` got its answer's head (or timed out) `latency` ns
    /// after it was sent, on the loop of `row`. Called for every attempt, a lone endpoint's too.
    func observe(latency: Int64, column: Int, row: LoopSlots, layout: RowLayout, at now: Int64)
}

extension BalancingPolicy {
    static var summary: String? { nil }
    static var stateWords: Int { 0 }
    static var columnWords: Int { 0 }
    func observe(latency: Int64, column: Int, row: LoopSlots, layout: RowLayout, at now: Int64) {}
}

/// The policies a configuration can name.
enum BalancingPolicies {
    /// Every policy Portico ships, the default first. Adding one is a `BalancingPolicy` in its own
    /// file and an entry here.
    static let standard: [any BalancingPolicy.Type] = [RoundRobinPolicy.self, LeastRequestPolicy.self, RandomPolicy.self, EWMAPolicy.self]

    static func named(_ name: String) -> (any BalancingPolicy.Type)? {
        standard.first { $0.name == name }
    }

    /// The schema's description of `balance`: every word, with its summary.
    static var schemaDescription: String {
        let words = standard.map { policy in policy.summary.map { "\(policy.name) (\($0))" } ?? policy.name }
        let listed = words.count > 1 ? words.dropLast().joined(separator: ", ") + " or " + words[words.count - 1] : words.joined()
        return "How an endpoint is picked: \(listed)."
    }
}

/// `upstreams.NAME.balance`: the word of one of `BalancingPolicies.standard` (each policy's file
/// names its own, `BalanceStrategy.roundRobin`, …).
public struct BalanceStrategy: RawRepresentable, Hashable, Sendable, CaseIterable, CustomStringConvertible {
    public let rawValue: String

    public init?(rawValue: String) {
        guard BalancingPolicies.named(rawValue) != nil else { return nil }
        self.rawValue = rawValue
    }

    init(_ policy: any BalancingPolicy.Type) {
        rawValue = policy.name
    }

    public static var allCases: [BalanceStrategy] { BalancingPolicies.standard.map(BalanceStrategy.init) }

    public var description: String { rawValue }

    /// A new instance of the policy this word names.
    func makePolicy() -> any BalancingPolicy {
        (BalancingPolicies.named(rawValue) ?? RoundRobinPolicy.self).init()
    }
}

/// The endpoints a pick may choose from: bit `i` stands for the set's endpoint `i`.
struct Candidates: Equatable {
    let mask: UInt64

    var count: Int { mask.nonzeroBitCount }

    /// The set's index of the `number`th candidate (counting from 0, lowest index first).
    func index(_ number: Int) -> Int {
        var rest = mask
        for _ in 0..<number { rest &= rest - 1 }
        return rest.trailingZeroBitCount
    }
}

/// Where a loop's row keeps what: a column of requests in flight per endpoint, the policy's
/// words, its words per column, then the random state.
struct RowLayout: Sendable, Equatable {
    let columns: Int
    let stateWords: Int
    var columnWords: Int = 0

    var width: Int { columns + stateWords + columns * columnWords + 1 }
    var randomSlot: Int { width - 1 }

    /// Where the policy's word `number` of `column` is.
    @inline(__always)
    func columnSlot(_ number: Int, of column: Int) -> Int { columns + stateWords + column * columnWords + number }

    /// A row for one loop, its random state seeded.
    func makeRow() -> LoopSlots {
        let row = LoopSlots(count: width)
        row.store(randomSlot, Int.random(in: 1...Int.max))
        return row
    }
}

extension LoopSlots {
    // A policy's use of its loop's row. (The row, the columns and the layout are passed to
    // `pick` one by one, not in a struct: a struct holding them would retain the set's shared
    // columns buffer on every pick, a write to a line every loop reads.)

    /// Requests in flight on this loop to the endpoint in column `column`.
    @inline(__always)
    func inFlight(column: Int) -> Int { load(column) }

    /// The policy's word `number` (below its `stateWords`).
    @inline(__always)
    func policyWord(_ number: Int, _ layout: RowLayout) -> Int { load(layout.columns + number) }

    @inline(__always)
    func setPolicyWord(_ number: Int, _ value: Int, _ layout: RowLayout) { store(layout.columns + number, value) }

    /// The policy's word `number` (below its `columnWords`) for the endpoint in column `column`.
    @inline(__always)
    func columnWord(_ number: Int, of column: Int, _ layout: RowLayout) -> Int { load(layout.columnSlot(number, of: column)) }

    @inline(__always)
    func setColumnWord(_ number: Int, of column: Int, _ value: Int, _ layout: RowLayout) {
        store(layout.columnSlot(number, of: column), value)
    }

    /// Uniform in `0..<bound`, from the row's own xorshift state (no system call, no shared word).
    func random(below bound: Int, _ layout: RowLayout) -> Int {
        var x = UInt64(bitPattern: Int64(load(layout.randomSlot)))
        x ^= x << 13
        x ^= x >> 7
        x ^= x << 17
        store(layout.randomSlot, Int(Int64(bitPattern: x)))
        return Int((x >> 11) % UInt64(bound))
    }
}
