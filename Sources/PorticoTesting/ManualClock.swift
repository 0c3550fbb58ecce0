import Foundation
import Portico
import Synchronization

/// A clock that only moves when a test says so. `sleep(until:)` suspends until `advance(by:)`
/// moves time past the deadline (or the task is cancelled), so tests of backoff, buckets and
/// expiry run instantly and deterministically.
///
/// ```swift
/// let clock = ManualClock()
/// async let response = middleware.handle(request, context: context(clock: clock), next: next)
/// await clock.waitForSleepers(1)      // the middleware is now waiting
/// clock.advance(by: .seconds(1))      // wake it
/// ```
public final class ManualClock: GatewayClock {
    private struct Sleeper {
        var deadline: ContinuousClock.Instant
        var continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var now: ContinuousClock.Instant
        var wall: Date
        var nextID: UInt64 = 0
        var sleepers: [UInt64: Sleeper] = [:]
        /// Sleeps cancelled before their continuation was registered.
        var cancelledEarly: Set<UInt64> = []
        /// Tests waiting for a number of sleepers.
        var waiters: [(count: Int, continuation: CheckedContinuation<Void, Never>)] = []
        /// Sleeps started so far (including ones that returned at once).
        var sleepsStarted = 0
    }

    private let state: Mutex<State>

    /// Starts at the real current instant (so `Duration` arithmetic with other instants stays
    /// sane) and at a fixed wall-clock date unless told otherwise.
    public init(now: ContinuousClock.Instant = ContinuousClock.now,
                wallNow: Date = Date(timeIntervalSince1970: 1_750_000_000)) {
        state = Mutex(State(now: now, wall: wallNow))
    }

    public var now: ContinuousClock.Instant { state.withLock { $0.now } }
    public var wallNow: Date { state.withLock { $0.wall } }

    /// Suspended sleepers right now.
    public var sleeperCount: Int { state.withLock { $0.sleepers.count } }

    /// Calls to `sleep(until:)` so far, including those whose deadline had already passed.
    public var sleepsStarted: Int { state.withLock { $0.sleepsStarted } }

    /// The earliest deadline any sleeper waits for.
    public var nextDeadline: ContinuousClock.Instant? {
        state.withLock { $0.sleepers.values.map(\.deadline).min() }
    }

    /// Moves both clocks forward and wakes every sleeper whose deadline has been reached.
    public func advance(by duration: Duration) {
        let woken: [CheckedContinuation<Void, any Error>] = state.withLock { state in
            state.now = state.now.advanced(by: duration)
            let (seconds, attoseconds) = duration.components
            state.wall = state.wall.addingTimeInterval(Double(seconds) + Double(attoseconds) / 1e18)
            let due = state.sleepers.filter { $0.value.deadline <= state.now }
            for id in due.keys { state.sleepers[id] = nil }
            return due.values.sorted { $0.deadline < $1.deadline }.map(\.continuation)
        }
        for continuation in woken { continuation.resume() }
    }

    /// The deadlines sleepers wait for, earliest first.
    public var pendingDeadlines: [ContinuousClock.Instant] {
        state.withLock { $0.sleepers.values.map(\.deadline).sorted() }
    }

    /// Moves time forward to `instant` (no-op when it has passed).
    public func advance(to instant: ContinuousClock.Instant) {
        let delta = now.duration(to: instant)
        if delta > .zero { advance(by: delta) }
    }

    /// Advances exactly to the earliest sleeper's deadline (if any), waking it.
    public func advanceToNextDeadline() {
        guard let deadline = nextDeadline else { return }
        let step = now.duration(to: deadline)
        advance(by: max(.zero, step))
    }

    public func sleep(until deadline: ContinuousClock.Instant) async throws {
        let id: UInt64? = state.withLock { state in
            state.sleepsStarted += 1
            guard deadline > state.now else { return nil }
            state.nextID += 1
            return state.nextID
        }
        guard let id else {
            try Task.checkCancellation()
            return
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let (registered, waiters) = state.withLock { state -> (Bool, [CheckedContinuation<Void, Never>]) in
                    if state.cancelledEarly.remove(id) != nil { return (false, []) }
                    state.sleepers[id] = Sleeper(deadline: deadline, continuation: continuation)
                    let count = state.sleepers.count
                    let ready = state.waiters.filter { $0.count <= count }.map(\.continuation)
                    state.waiters.removeAll { $0.count <= count }
                    return (true, ready)
                }
                if !registered { continuation.resume(throwing: CancellationError()) }
                for waiter in waiters { waiter.resume() }
            }
        } onCancel: {
            let continuation: CheckedContinuation<Void, any Error>? = state.withLock { state in
                if let sleeper = state.sleepers.removeValue(forKey: id) { return sleeper.continuation }
                state.cancelledEarly.insert(id)
                return nil
            }
            continuation?.resume(throwing: CancellationError())
        }
    }

    /// Returns once at least `count` sleepers are suspended. Lets a test advance time only
    /// after the code under test has started waiting, without polling or real sleeps.
    public func waitForSleepers(_ count: Int = 1) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                if state.sleepers.count >= count { return true }
                state.waiters.append((count, continuation))
                return false
            }
            if ready { continuation.resume() }
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
