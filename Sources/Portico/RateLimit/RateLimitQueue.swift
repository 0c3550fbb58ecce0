import Metrics
import Synchronization

/// The requests of one `rate_limit` middleware waiting for their token (`on_limit: wait`):
/// how many there are, bounded by `max_waiting`, and how long they waited. Only waiting
/// requests touch it (one atomic add on entering and one on leaving); a request that goes at
/// once never does. The waiting itself is a timer on the request's own event loop
/// (`LoopTimer`): no thread and no polling. A request the store decided on the server's thread
/// waits before its task runs any of its chain (`DeferredStart`), so what it holds is its
/// connection, its request and a small task; with `priority:` or a shared store it waits
/// inside the chain.
public final class RateLimitQueue: Sendable {
    public let middleware: String
    private let waiting = Atomic<Int>(0)
    /// Who goes first among the waiters of one bucket, with `priority:`.
    let line = PriorityLine()
    /// `portico_ratelimit_waiting{middleware}`: requests waiting now.
    private let depth: Meter
    /// `portico_ratelimit_wait_seconds{middleware}`: how long requests that waited waited.
    private let waited: Metrics.Timer

    public init(middleware: String) {
        self.middleware = middleware
        depth = Meter(label: "portico_ratelimit_waiting", dimensions: [("middleware", middleware)])
        waited = Metrics.Timer(label: "portico_ratelimit_wait_seconds", dimensions: [("middleware", middleware)])
    }

    /// Requests waiting right now.
    public var count: Int { waiting.load(ordering: .relaxed) }

    /// Takes a place; `false` (taking none) when `limit` are already waiting.
    func enter(limit: Int) -> Bool {
        let before = waiting.wrappingAdd(1, ordering: .relaxed).oldValue
        guard before < limit else {
            waiting.wrappingSubtract(1, ordering: .relaxed)
            return false
        }
        depth.increment()
        return true
    }

    func leave() {
        waiting.wrappingSubtract(1, ordering: .relaxed)
        depth.decrement()
    }

    func record(waited duration: Duration) {
        waited.recordNanoseconds(GatewayMetrics.nanoseconds(duration))
    }
}

/// Why a rate limiter refused a request: the `reason` label of `portico_ratelimit_rejected_total`.
public enum RateLimitRefusal: String, Sendable, CaseIterable {
    /// Over the rate (`on_limit: reject`).
    case rate
    /// The token is further away than `max_wait` or the request's deadline.
    case waitTooLong = "wait_too_long"
    /// `max_waiting` requests were already waiting.
    case queueFull = "queue_full"
    /// A `quota` middleware's allocation is spent (counted by `QuotaMiddleware`).
    case quota
    /// While it waited, a higher-priority request took its turn (`priority:`, every turn within
    /// the newcomer's wait taken).
    case displaced
}
