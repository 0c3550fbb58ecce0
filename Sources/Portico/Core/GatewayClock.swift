import Foundation
import NIOCore

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
    /// `instant` as an event-loop deadline, when SwiftNIO's timers keep this clock's time, so that
    /// a deadline can be a timer on the connection's loop instead of a task sleeping beside the
    /// work; `nil` (the default) for a clock that moves otherwise (a test's, moved by hand), whose
    /// deadlines race its `sleep`.
    func eventLoopDeadline(for instant: ContinuousClock.Instant) -> NIODeadline?
}

extension GatewayClock {
    public func eventLoopDeadline(for instant: ContinuousClock.Instant) -> NIODeadline? { nil }

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
    /// NIO's timers run on the same monotonic time as `ContinuousClock`.
    public func eventLoopDeadline(for instant: ContinuousClock.Instant) -> NIODeadline? {
        .now() + TimeAmount(ContinuousClock.now.duration(to: instant))
    }
}
