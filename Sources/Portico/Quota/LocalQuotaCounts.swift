import Foundation

/// A quota's counts in this process: what `on_store_error: local` goes on from, one slot per
/// allocation (so memory is fixed by the configuration, whatever keys clients send).
///
/// Each slot remembers the count the store last gave for the current window, and while the
/// store fails it counts on from there; what it served meanwhile (`pending`) is added to the
/// shared count with the next call that reaches the store. Each slot has a lock of its own: the
/// requests that take it are those of one allocation, which the store serializes anyway.
public final class LocalQuotaCounts: QuotaStore {
    struct Slot {
        /// The window the count is for; another window starts from zero.
        var window: Date = .distantPast
        var used = 0
        /// Counted here, not yet in the store.
        var pending = 0

        mutating func enter(_ window: CalendarWindow) {
            guard self.window != window.start else { return }
            self = Slot(window: window.start)
        }
    }

    final class Cell: Sendable {
        let state = Mutex(Slot())
    }

    private let cells: [Cell]

    public init(allocations: Int) {
        cells = (0..<max(1, allocations)).map { _ in Cell() }
    }

    private func slot(_ allocation: QuotaAllocation) -> Cell {
        cells[min(max(0, allocation.index), cells.count - 1)]
    }

    /// Counts here alone; `pending` when the store should hear of it later.
    public func charge(_ allocation: QuotaAllocation, in window: CalendarWindow, at now: Date) async -> QuotaDecision {
        take(allocation, in: window, pending: false)
    }

    func take(_ allocation: QuotaAllocation, in window: CalendarWindow, pending: Bool) -> QuotaDecision {
        slot(allocation).state.withLock { slot in
            slot.enter(window)
            guard slot.used < allocation.limit else {
                return QuotaDecision(allowed: false, limit: allocation.limit, used: slot.used)
            }
            slot.used += 1
            if pending { slot.pending += 1 }
            return QuotaDecision(allowed: true, limit: allocation.limit, used: slot.used)
        }
    }

    /// The count as last known (store or local) for `window`.
    func used(_ allocation: QuotaAllocation, in window: CalendarWindow) -> Int {
        slot(allocation).state.withLock { slot in
            slot.enter(window)
            return slot.used
        }
    }

    /// The store's count after a call: replies may arrive out of order, so the count only grows.
    func observe(_ used: Int, _ allocation: QuotaAllocation, in window: CalendarWindow) {
        slot(allocation).state.withLock { slot in
            slot.enter(window)
            slot.used = max(slot.used, used)
        }
    }

    /// Hands over what was served during an outage, for the call about to reach the store.
    func takePending(_ allocation: QuotaAllocation, in window: CalendarWindow) -> Int {
        slot(allocation).state.withLock { slot in
            slot.enter(window)
            defer { slot.pending = 0 }
            return slot.pending
        }
    }

    /// Gives back what `takePending` handed over when the call failed.
    func restorePending(_ count: Int, _ allocation: QuotaAllocation, in window: CalendarWindow) {
        guard count > 0 else { return }
        slot(allocation).state.withLock { slot in
            guard slot.window == window.start else { return }  // that window is over: nothing to add to
            slot.pending += count
        }
    }
}
