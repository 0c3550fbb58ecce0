import Foundation

/// Time as the gateway sees it. Everything time-dependent (deadlines, token expiry, token
/// buckets, cache freshness) reads this injected clock, so tests advance time instead of
/// sleeping.
public protocol GatewayClock: Sendable {
    /// Monotonic time: deadlines, expiry, buckets.
    var now: ContinuousClock.Instant { get }
    /// Wall-clock time: HTTP dates (`Date`, `Expires`, `Retry-After`).
    var wallNow: Date { get }
    /// Suspends until `deadline` on this clock (or throws `CancellationError`).
    func sleep(until deadline: ContinuousClock.Instant) async throws
}

extension GatewayClock {
    public func sleep(for duration: Duration) async throws {
        try await sleep(until: now.advanced(by: duration))
    }
}

/// The real clock.
public struct SystemClock: GatewayClock {
    public init() {}
    public var now: ContinuousClock.Instant { ContinuousClock.now }
    public var wallNow: Date { Date() }
    public func sleep(until deadline: ContinuousClock.Instant) async throws {
        try await Task.sleep(until: deadline, clock: .continuous)
    }
}
