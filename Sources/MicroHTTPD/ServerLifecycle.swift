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
