import Synchronization

/// How urgent a waiting request is (`priority: header:NAME`): the header's value `high`,
/// `normal` or `low`, case-insensitively; a missing or any other value is `normal`, so a client
/// cannot fail a request by sending a word Portico does not know.
public enum WaitPriority: Int, Sendable, Comparable, CaseIterable, CustomStringConvertible {
    case low = 0, normal = 1, high = 2

    public init(headerValue: String?) {
        switch headerValue?.lowercased() {
        case "high": self = .high
        case "low": self = .low
        default: self = .normal
        }
    }

    public static func < (a: WaitPriority, b: WaitPriority) -> Bool { a.rawValue < b.rawValue }

    public var description: String {
        switch self {
        case .low: "low"
        case .normal: "normal"
        case .high: "high"
        }
    }
}

/// The order in which one rate limiter's waiting requests go when they have priorities, as a
/// value: what happens when a request joins or leaves, with no clock and no lock, so every rule
/// below is tested as plain data (`PriorityLineStateTests`).
///
/// The store hands out turns (instants at which one request may go) first come, first served;
/// the line only decides who holds which turn, so the rate the store keeps is never exceeded.
/// - A request never takes a turn before an earlier request of its own or a higher priority
///   (FIFO within a priority).
/// - A request that joins with a turn of its own takes the earliest turn held by a lower-priority
///   request that came after every waiter of its own or a higher priority; each of those lower
///   requests moves to the next of their turns, the last to the newcomer's. A lower request whose
///   next turn would be past its own deadline (`max_wait`, or the request's deadline) keeps its
///   turn, and so do the ones before it: no request waits longer than it may because of priority.
/// - A request that joins without a turn (every turn within its wait is taken) takes, the same
///   way, the turn of the last waiter of the lowest priority below its own, which is refused at
///   once (`Joined.refused`, then its sleep is interrupted): under overload the low go first.
struct PriorityLineState {
    struct Waiter: Equatable {
        let id: UInt64
        let priority: WaitPriority
        /// When it goes.
        var turn: ContinuousClock.Instant
        /// It must not go later than this.
        let deadline: ContinuousClock.Instant
    }

    /// What `join` did: the newcomer's turn (`nil`: nobody it may displace, refused), and the
    /// waiter it displaced out of the line, if any.
    struct Joined: Equatable {
        var turn: ContinuousClock.Instant?
        var refused: UInt64?
    }

    /// Each key's waiters in the order of their turns.
    private(set) var lines: [String: [Waiter]] = [:]

    /// The waiters of every key.
    var count: Int { lines.values.reduce(0) { $0 + $1.count } }

    func turn(of id: UInt64, key: String) -> ContinuousClock.Instant? {
        lines[key]?.first { $0.id == id }?.turn
    }

    /// Adds waiter `id` to `key`'s line. `turn`: the turn the store reserved for it, or `nil`
    /// when the store refused it (every turn within `deadline` is taken).
    mutating func join(id: UInt64, key: String, priority: WaitPriority, turn: ContinuousClock.Instant?,
                       deadline: ContinuousClock.Instant) -> Joined {
        var line = lines[key] ?? []
        // The newcomer goes after every waiter of its priority or above.
        let floor = line.lastIndex { $0.priority >= priority }
        let candidates = Array(line.indices.drop { $0 <= (floor ?? -1) }.filter { line[$0].priority < priority })
        var joined = Joined(turn: turn, refused: nil)
        if let turn {
            // turns[m] is candidate m's turn; the last one is the newcomer's own.
            let turns = candidates.map { line[$0].turn } + [turn]
            var start = candidates.count
            while start > 0, turns[start] <= line[candidates[start - 1]].deadline { start -= 1 }
            joined.turn = turns[start]
            for m in start..<candidates.count { line[candidates[m]].turn = turns[m + 1] }
        } else {
            guard let lowest = candidates.map({ line[$0].priority }).min(),
                  let victim = candidates.lastIndex(where: { line[$0].priority == lowest }) else {
                return Joined(turn: nil, refused: nil)
            }
            var start = victim
            while start > 0, line[candidates[start]].turn <= line[candidates[start - 1]].deadline { start -= 1 }
            // The newcomer's deadline bounds how far forward the shift may start.
            while start < victim, line[candidates[start]].turn > deadline { start += 1 }
            guard line[candidates[start]].turn <= deadline else { return Joined(turn: nil, refused: nil) }
            joined.turn = line[candidates[start]].turn
            for m in start..<victim { line[candidates[m]].turn = line[candidates[m + 1]].turn }
            joined.refused = line[candidates[victim]].id
            line.remove(at: candidates[victim])
        }
        if let mine = joined.turn {
            let waiter = Waiter(id: id, priority: priority, turn: mine, deadline: deadline)
            let at = line.firstIndex { $0.turn > mine } ?? line.endIndex
            line.insert(waiter, at: at)
        }
        lines[key] = line
        return joined
    }

    /// Removes waiter `id` (it went, or its client left); its turn is not handed on here: the
    /// caller gives an unused one back to the store.
    mutating func leave(id: UInt64, key: String) {
        guard var line = lines[key], let index = line.firstIndex(where: { $0.id == id }) else { return }
        line.remove(at: index)
        lines[key] = line.isEmpty ? nil : line
    }
}

/// One rate limiter's priority line, shared by the event loops whose requests wait in it. Only
/// waiting requests take its lock (a request that goes at once never does), and a waiting
/// request takes it twice plus once per turn it was moved to: the waiting path's own cost, never
/// the request path's. Its size is bounded by `max_waiting`, like the waiting itself.
final class PriorityLine: Sendable {
    /// A waiter's interruption: set when a higher-priority request displaced it; its sleep ends
    /// at once (also when displaced before it began to sleep).
    final class Interrupt: Sendable {
        private let state = Mutex<(fired: Bool, wake: (@Sendable () -> Void)?)>((false, nil))

        var fired: Bool { state.withLock { $0.fired } }

        func fire() {
            let wake = state.withLock { state -> (@Sendable () -> Void)? in
                state.fired = true
                defer { state.wake = nil }
                return state.wake
            }
            wake?()
        }

        /// Registers what ends the sleep; runs it at once when already fired.
        func onFire(_ wake: @escaping @Sendable () -> Void) {
            let now = state.withLock { state -> Bool in
                if state.fired { return true }
                state.wake = wake
                return false
            }
            if now { wake() }
        }
    }

    private struct Shared {
        var state = PriorityLineState()
        var interrupts: [UInt64: Interrupt] = [:]
        var nextID: UInt64 = 0
    }

    private let shared = Mutex(Shared())

    /// Waiters in every key's line (tests, diagnostics).
    var count: Int { shared.withLock { $0.state.count } }

    /// A place in `key`'s line, or `nil` when the request was refused a turn. See
    /// `PriorityLineState.join`.
    func join(key: String, priority: WaitPriority, turn: ContinuousClock.Instant?,
              deadline: ContinuousClock.Instant) -> Place? {
        let (place, displaced) = shared.withLock { shared -> (Place?, Interrupt?) in
            let id = shared.nextID
            shared.nextID &+= 1
            let joined = shared.state.join(id: id, key: key, priority: priority, turn: turn, deadline: deadline)
            let displaced = joined.refused.flatMap { shared.interrupts.removeValue(forKey: $0) }
            guard joined.turn != nil else { return (nil, displaced) }
            let interrupt = Interrupt()
            shared.interrupts[id] = interrupt
            return (Place(id: id, key: key, interrupt: interrupt), displaced)
        }
        displaced?.fire()
        return place
    }

    /// `place`'s turn now; `nil` once it was displaced out of the line.
    func turn(of place: Place) -> ContinuousClock.Instant? {
        shared.withLock { $0.state.turn(of: place.id, key: place.key) }
    }

    func leave(_ place: Place) {
        shared.withLock { shared in
            shared.state.leave(id: place.id, key: place.key)
            shared.interrupts[place.id] = nil
        }
    }

    struct Place: Sendable {
        let id: UInt64
        let key: String
        let interrupt: Interrupt
    }
}
