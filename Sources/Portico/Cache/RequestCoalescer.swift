import Synchronization

/// One upstream fetch per cache key at a time: the first request for a key leads, later ones
/// wait for its outcome, each within its own deadline. The table is bounded; when it is full,
/// requests simply fetch on their own.
///
/// A key whose response could not be stored is marked for a while ("hit-for-pass") so that its
/// requests go upstream without waiting; the marks (`PassMarks`) are read without the table's
/// lock and renewed by the requests that pass, so a route the cache only passes through takes
/// no lock shared between threads (issue #42).
public final class RequestCoalescer: Sendable {
    public enum Outcome: Sendable {
        /// The leader stored this response: waiters whose `Vary` values match may use it.
        case stored(CacheEntry)
        /// The response could not be shared (not storable, an error): waiters fetch themselves.
        case notShared
    }

    /// One fetch in flight and the requests waiting on it.
    public final class Flight: Sendable {
        private struct State {
            var outcome: Outcome?
            var waiters: [UInt64: CheckedContinuation<Outcome?, Never>] = [:]
            var nextID: UInt64 = 0
        }

        private let state = Mutex(State())

        fileprivate func finish(_ outcome: Outcome) {
            let waiters = state.withLock { state in
                state.outcome = outcome
                defer { state.waiters = [:] }
                return Array(state.waiters.values)
            }
            for waiter in waiters { waiter.resume(returning: outcome) }
        }

        public var waiterCount: Int { state.withLock { $0.waiters.count } }

        /// The leader's outcome, or `nil` when this task was cancelled first.
        fileprivate func outcome() async -> Outcome? {
            let id = state.withLock { state -> UInt64 in
                state.nextID += 1
                return state.nextID
            }
            return await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Outcome?, Never>) in
                    let ready: Outcome?? = state.withLock { state in
                        if let outcome = state.outcome { return .some(outcome) }
                        if Task.isCancelled { return .some(nil) }
                        state.waiters[id] = continuation
                        return .none
                    }
                    if let ready { continuation.resume(returning: ready) }
                }
            } onCancel: {
                let continuation = state.withLock { $0.waiters.removeValue(forKey: id) }
                continuation?.resume(returning: nil)
            }
        }

        /// Waits for the leader until `deadline` on `clock`. Throws `CancellationError` when the
        /// waiting task is cancelled and `GatewayError.requestTimeout` when the deadline passes.
        public func wait(until deadline: ContinuousClock.Instant, clock: any GatewayClock) async throws -> Outcome {
            let result = await withTaskGroup(of: Outcome?.self) { group in
                group.addTask { await self.outcome() }
                group.addTask {
                    try? await clock.sleep(until: deadline)
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first
            }
            if let result { return result }
            try Task.checkCancellation()
            throw GatewayError.requestTimeout("the request did not complete within its deadline while waiting for the same response")
        }
    }

    public enum Role: Sendable {
        /// Fetch, then call `finish`.
        case leader(Flight)
        /// Wait on the flight.
        case follower(Flight)
        /// The table is full: fetch without coalescing.
        case alone
    }

    /// Flights by key.
    private let table = Mutex<[String: Flight]>([:])
    /// Keys whose last response could not be stored, until when: requests for them skip the
    /// wait, so an uncacheable URI is not serialised behind itself.
    private let passMarks: PassMarks
    public let limit: Int
    /// How long a key stays marked uncacheable after a response that could not be stored.
    public let passDuration: Duration

    public init(limit: Int, passDuration: Duration = .seconds(10)) {
        self.limit = limit
        self.passDuration = passDuration
        // Two slots per flight the table may hold, so marks seldom overwrite each other.
        passMarks = PassMarks(slots: min(1 << 16, max(64, 2 * limit)))
    }

    public var inFlight: Int { table.withLock { $0.count } }

    /// Requests waiting on some flight (diagnostics and tests).
    public var waiting: Int { table.withLock { $0.values.reduce(0) { $0 + $1.waiterCount } } }

    /// A marked key goes `.alone` without the lock; the caller then tells `passed` what its
    /// response was.
    public func join(_ key: String, at now: ContinuousClock.Instant) -> Role {
        if let until = passMarks.until(hash: key.hashValue), now < until { return .alone }
        return table.withLock { flights in
            if let flight = flights[key] { return .follower(flight) }
            guard flights.count < limit else { return .alone }
            let flight = Flight()
            flights[key] = flight
            return .leader(flight)
        }
    }

    /// Publishes the leader's outcome and frees the key for the next fetch. `uncacheable`
    /// marks the key so the next requests within `passDuration` go upstream without waiting.
    public func finish(_ key: String, _ flight: Flight, _ outcome: Outcome, uncacheableAt now: ContinuousClock.Instant? = nil) {
        table.withLock { flights in
            if flights[key] === flight { flights[key] = nil }
        }
        if let now { passMarks.mark(hash: key.hashValue, until: now.advanced(by: passDuration)) }
        flight.finish(outcome)
    }

    /// A request that went `.alone` got a response that could not be stored: the key's mark is
    /// renewed once less than half of `passDuration` is left (or set, when it had none), so
    /// requests keep passing without a leader every `passDuration`, and the mark's word is
    /// written a few times per `passDuration`, not per request.
    public func passed(_ key: String, uncacheableAt now: ContinuousClock.Instant) {
        let hash = key.hashValue
        if let until = passMarks.until(hash: hash), now.duration(to: until) >= passDuration / 2 { return }
        passMarks.mark(hash: hash, until: now.advanced(by: passDuration))
    }
}
