import Synchronization

/// Caps the extra load retries add, so a failing upstream sees at most `(1 + ratio)` times its
/// normal traffic instead of `attempts` times (a retry storm would prolong the outage).
///
/// A sliding window of `slots` buckets counts original requests and retries. A retry is
/// allowed while retries in the window stay within `max(ratio × requests, minPerSecond ×
/// window)`: the floor lets a quiet route still retry an occasional failure. One budget is
/// shared by every route using the middleware instance.
public final class RetryBudget: Sendable {
    public let ratio: Double
    public let minPerSecond: Int
    public let window: Duration

    private struct Slot {
        var epoch = Int.min
        var requests = 0
        var retries = 0
    }

    private struct State {
        /// Set by the first call, so epochs are counted on whatever clock the caller uses.
        var origin: ContinuousClock.Instant?
        var slots: [Slot]
    }

    private let slotLength: Duration
    private let state: Mutex<State>

    public init(ratio: Double, minPerSecond: Int, window: Duration = .seconds(10), slots: Int = 10) {
        self.ratio = ratio
        self.minPerSecond = minPerSecond
        self.window = window
        self.slotLength = window / max(1, slots)
        self.state = Mutex(State(origin: nil, slots: Array(repeating: Slot(), count: max(1, slots))))
    }

    /// Counts an original request (call once per request, before any retry).
    public func recordRequest(at now: ContinuousClock.Instant) {
        state.withLock { state in
            let index = Self.current(&state, now: now, slotLength: slotLength)
            state.slots[index].requests += 1
        }
    }

    /// Takes one retry from the budget; `false` when it is spent.
    public func tryAcquireRetry(at now: ContinuousClock.Instant) -> Bool {
        state.withLock { state in
            let index = Self.current(&state, now: now, slotLength: slotLength)
            let (requests, retries) = Self.totals(state)
            guard Double(retries + 1) <= allowance(requests: requests) else { return false }
            state.slots[index].retries += 1
            return true
        }
    }

    /// Retries allowed in one window with `requests` original requests in it.
    public func allowance(requests: Int) -> Double {
        let windowSeconds = Double(window.components.seconds) + Double(window.components.attoseconds) / 1e18
        return max(ratio * Double(requests), Double(minPerSecond) * windowSeconds)
    }

    /// Original requests and retries in the current window (tests, diagnostics).
    public func counts(at now: ContinuousClock.Instant) -> (requests: Int, retries: Int) {
        state.withLock { state in
            _ = Self.current(&state, now: now, slotLength: slotLength)
            return Self.totals(state)
        }
    }

    /// The slot for `now`, cleared when it last held an older epoch; slots older than the
    /// window are cleared too, so `totals` only sums the window.
    private static func current(_ state: inout State, now: ContinuousClock.Instant, slotLength: Duration) -> Int {
        let origin = state.origin ?? now
        state.origin = origin
        let elapsed = max(.zero, origin.duration(to: now))
        let epoch = Int(elapsed / slotLength)
        let count = state.slots.count
        for i in state.slots.indices where state.slots[i].epoch <= epoch - count {
            state.slots[i] = Slot()
        }
        let index = epoch % count
        if state.slots[index].epoch != epoch {
            state.slots[index] = Slot(epoch: epoch)
        }
        return index
    }

    private static func totals(_ state: State) -> (requests: Int, retries: Int) {
        state.slots.reduce(into: (0, 0)) { sum, slot in
            guard slot.epoch != Int.min else { return }
            sum.0 += slot.requests
            sum.1 += slot.retries
        }
    }
}
