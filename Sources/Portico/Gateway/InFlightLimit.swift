import LockAudit
import Synchronization

/// A cap on requests in flight: past it, requests are refused at once (503 `overloaded`)
/// instead of queueing behind slow upstreams without bound. `listen.max_in_flight` and a route's
/// `max_in_flight` mean what they say for the whole process, so the count is one shared atomic
/// (`SharedCap`), never a lock: one add and one subtract a request.
public final class InFlightLimit: Sendable {
    private let count: SharedCap
    private let limitStorage: Atomic<Int>

    /// `limit` 0 means no cap. `name` is the configuration key it enforces.
    public init(limit: Int, name: String = "max_in_flight") {
        count = SharedCap(name: name)
        limitStorage = Atomic(max(0, limit))
    }

    /// The cap; changing it (on reload) keeps the requests already counted.
    public var limit: Int {
        get { limitStorage.load(ordering: .relaxed) }
        set { limitStorage.store(max(0, newValue), ordering: .relaxed) }
    }

    public var current: Int { count.current }

    /// Counts one more request, or refuses it when the cap is reached. A `true` answer must be
    /// matched by one `leave()`.
    public func tryEnter() -> Bool {
        count.tryAcquire(limit: limit)
    }

    public func leave() {
        count.release()
    }
}
