import Foundation
import Portico
import Synchronization

/// A clock that only moves when a test says so. `advance(by:)` wakes every sleeper whose
/// deadline has passed, so expiry, backoff and timeouts are tested without real waiting.
public final class ManualClock: GatewayClock {
    private struct Sleeper {
        var deadline: ContinuousClock.Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: ContinuousClock.Instant
        var wallNow: Date
        var nextID = 0
        var sleepers: [Int: Sleeper] = [:]
        /// Sleeps cancelled before they were registered.
        var cancelledEarly: Set<Int> = []
    }

    private let state: Mutex<State>

    public init(now: ContinuousClock.Instant = ContinuousClock.now,
                wallNow: Date = Date(timeIntervalSince1970: 1_750_000_000)) {
        state = Mutex(State(now: now, wallNow: wallNow))
    }

    public var now: ContinuousClock.Instant { state.withLock { $0.now } }
    public var wallNow: Date { state.withLock { $0.wallNow } }

    /// Tasks currently sleeping on this clock.
    public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    /// The deadlines sleepers wait for, earliest first.
    public var pendingDeadlines: [ContinuousClock.Instant] {
        state.withLock { $0.sleepers.values.map(\.deadline).sorted() }
    }

    public func sleep(until deadline: ContinuousClock.Instant) async throws {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let immediate = state.withLock { state -> Result<Void, any Error>? in
                    if state.cancelledEarly.remove(id) != nil { return .failure(CancellationError()) }
                    if deadline <= state.now { return .success(()) }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    return nil
                }
                if let immediate { continuation.resume(with: immediate) }
            }
        } onCancel: {
            let continuation = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                if let sleeper = state.sleepers.removeValue(forKey: id) { return sleeper.continuation }
                state.cancelledEarly.insert(id)
                return nil
            }
            continuation?.resume(throwing: CancellationError())
        }
        // A cancellation that raced with a normal wake-up leaves a mark behind: drop it.
        state.withLock { _ = $0.cancelledEarly.remove(id) }
    }

    /// Moves time forward and wakes the sleepers whose deadline has come.
    public func advance(by duration: Duration) {
        let due = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
            state.now = state.now.advanced(by: duration)
            state.wallNow = state.wallNow.addingTimeInterval(
                Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18)
            let now = state.now
            let ids = state.sleepers.filter { $0.value.deadline <= now }.map(\.key)
            return ids.compactMap { state.sleepers.removeValue(forKey: $0)?.continuation }
        }
        for continuation in due { continuation.resume() }
    }

    /// Moves time forward to `instant` (no-op when it has passed).
    public func advance(to instant: ContinuousClock.Instant) {
        let delta = now.duration(to: instant)
        if delta > .zero { advance(by: delta) }
    }

    /// Waits (really, polling briefly) until at least `count` tasks sleep on this clock,
    /// e.g. a background refresher that is about to be woken by `advance`.
    public func waitForSleepers(_ count: Int = 1, timeout: Duration = .seconds(30)) async throws {
        try await Eventually.wait(timeout: timeout, "\(count) sleeper(s) on the manual clock") {
            self.sleeperCount >= count
        }
    }
}

/// Polls a condition until it holds: for state reached asynchronously (a background task,
/// another thread). Not a fixed sleep: returns as soon as the condition holds.
public enum Eventually {
    public struct TimedOut: Error, CustomStringConvertible {
        public var description: String
    }

    public static func wait(timeout: Duration = .seconds(30), _ what: String = "condition",
                            _ condition: @Sendable () async -> Bool) async throws {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while !(await condition()) {
            guard ContinuousClock.now < deadline else { throw TimedOut(description: "timed out waiting for \(what)") }
            try await Task.sleep(for: .milliseconds(2))
        }
    }
}
