/// `ContinuousClock` instants as nanoseconds since the process's first use of this type, so a
/// deadline fits in one atomic (a deadline another thread reads needs no lock).
enum MonotonicTime {
    static let epoch = ContinuousClock.now
    /// Stands for "no deadline".
    static let never = Int64.max

    static func nanoseconds(_ instant: ContinuousClock.Instant) -> Int64 {
        let (seconds, attoseconds) = epoch.duration(to: instant).components
        return seconds &* 1_000_000_000 &+ attoseconds / 1_000_000_000
    }

    static func instant(_ nanoseconds: Int64) -> ContinuousClock.Instant {
        epoch.advanced(by: .nanoseconds(nanoseconds))
    }
}
