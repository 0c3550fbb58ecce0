import Synchronization

/// Where an `HTTPServer` is in its life. It only moves forward (`ServerCore.advance(to:)`);
/// everything else only reads it, from any thread.
public enum ServerLifecycle: Int, Sendable, Comparable {
    /// Made, not started.
    case created
    /// Accepting connections and serving them.
    case running
    /// Still accepting and serving, but every answer asks its client to close the connection,
    /// so clients move elsewhere while a load balancer takes this instance out.
    case draining
    /// No longer accepting. Requests on open connections are still served (and their connections
    /// closed) until none is in flight or the grace is over.
    case stopping
    /// Nothing is in flight (or the grace is over): a request completed now is answered 503 at
    /// once instead of being handed to a task, because libmicrohttpd cannot stop a daemon with
    /// a suspended connection. What is still running is answered 503 too.
    case closing
    /// The daemons are stopped.
    case stopped

    public static func < (lhs: ServerLifecycle, rhs: ServerLifecycle) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// The one place a server's lifecycle is kept and moved: an atomic every thread reads and only
/// lifecycle moves write.
final class LifecycleState: Sendable {
    private let phase = Atomic<Int>(ServerLifecycle.created.rawValue)

    var current: ServerLifecycle { ServerLifecycle(rawValue: phase.load(ordering: .sequentiallyConsistent))! }
    /// Answers ask their clients to close the connection from `draining` on. Any thread.
    var isDraining: Bool { phase.load(ordering: .relaxed) >= ServerLifecycle.draining.rawValue }

    /// Moves forward to `next` if at `expected`; returns whether it moved.
    @discardableResult
    func advance(from expected: ServerLifecycle, to next: ServerLifecycle) -> Bool {
        precondition(expected < next, "the lifecycle only moves forward: \(expected) → \(next)")
        return phase.compareExchange(expected: expected.rawValue, desired: next.rawValue, ordering: .sequentiallyConsistent).exchanged
    }

    /// Moves forward to `next` from wherever it is before it; returns whether it moved.
    @discardableResult
    func advance(to next: ServerLifecycle) -> Bool {
        var current = phase.load(ordering: .sequentiallyConsistent)
        while current < next.rawValue {
            let (exchanged, found) = phase.compareExchange(expected: current, desired: next.rawValue,
                                                           ordering: .sequentiallyConsistent)
            if exchanged { return true }
            current = found
        }
        return false
    }
}
