/// Full-jitter exponential backoff: before retry *n* (1-based) wait a uniformly random time in
/// `[0, min(cap, base·2^(n-1))]`. Jitter spreads the retries of many clients that failed
/// together, so they do not return in lockstep (AWS architecture blog, "Exponential Backoff
/// and Jitter").
public struct Backoff: Sendable, Equatable {
    public var base: Duration
    public var cap: Duration

    public init(base: Duration, cap: Duration) {
        self.base = base
        self.cap = cap
    }

    /// The longest wait before retry `retry` (1-based): `base·2^(retry-1)`, at most `cap`.
    public func ceiling(forRetry retry: Int) -> Duration {
        var ceiling = base
        var step = 1
        // Doubling stops at the cap, so large retry numbers cannot overflow.
        while step < retry, ceiling < cap {
            ceiling = ceiling * 2
            step += 1
        }
        return min(ceiling, cap)
    }

    /// The wait before retry `retry` for a random draw `unit` in `[0, 1)`.
    public func delay(forRetry retry: Int, unit: Double) -> Duration {
        let fraction = min(max(unit, 0), 1)
        return ceiling(forRetry: retry) * fraction
    }
}
