import Synchronization

/// A count that every thread may change: what a global cap (`listen.max_in_flight`,
/// `listen.connection_limit`, an upstream's `max_connections`) needs when it is not split
/// between threads. One atomic, never a lock: an uncontended atomic add costs about as much as a
/// plain one, and under contention it costs one cache-line transfer, never a sleep; it is taken
/// once per request (or per connection), where a lock would be held across work.
///
/// Each is named, so the confinement test can list the shared counters a proxied request touches.
public final class SharedCap: Sendable {
    public let name: String
    private let count = Atomic<Int>(0)
    private let auditID: Int

    public init(name: String) {
        self.name = name
        auditID = LockAudit.isRecording ? LockAudit.register(site: LockAudit.Site(name: "cap: " + name)) : 0
    }

    /// Counts one more unless `limit` (> 0) is reached; `limit` 0 means no cap.
    /// A `true` answer must be matched by one `release()`.
    @inline(__always)
    public func tryAcquire(limit: Int) -> Bool {
        if auditID != 0 && LockAudit.isRecording { LockAudit.taken(auditID) }
        let now = count.wrappingAdd(1, ordering: .relaxed).newValue
        if limit > 0 && now > limit {
            count.wrappingSubtract(1, ordering: .relaxed)
            return false
        }
        return true
    }

    @inline(__always)
    public func release() {
        if auditID != 0 && LockAudit.isRecording { LockAudit.taken(auditID) }
        count.wrappingSubtract(1, ordering: .relaxed)
    }

    public var current: Int { count.load(ordering: .relaxed) }
}
