import Synchronization

/// A cap on requests in flight: past it, requests are refused at once (503 `overloaded`)
/// instead of queueing behind slow upstreams without bound. Lock-free: one atomic per request.
public final class InFlightLimit: Sendable {
    private let count = Atomic<Int>(0)
    private let limitStorage: Atomic<Int>

    /// `limit` 0 means no cap.
    public init(limit: Int) {
        limitStorage = Atomic(max(0, limit))
    }

    /// The cap; changing it (on reload) keeps the requests already counted.
    public var limit: Int {
        get { limitStorage.load(ordering: .relaxed) }
        set { limitStorage.store(max(0, newValue), ordering: .relaxed) }
    }

    public var current: Int { count.load(ordering: .relaxed) }

    /// Counts one more request, or refuses it when the cap is reached. A `true` answer must be
    /// matched by one `leave()`.
    public func tryEnter() -> Bool {
        let limit = self.limit
        let now = count.wrappingAdd(1, ordering: .relaxed).newValue
        if limit > 0 && now > limit {
            count.wrappingSubtract(1, ordering: .relaxed)
            return false
        }
        return true
    }

    public func leave() {
        count.wrappingSubtract(1, ordering: .relaxed)
    }
}
