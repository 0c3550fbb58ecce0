import CMicroHTTPD
import Synchronization

/// Suspends and resumes one connection, so that however many parties wake it — a handler's
/// answer, an upload's reader catching up, a response stream's next chunk, a client leaving —
/// libmicrohttpd resumes it exactly once per suspension and never after it closed.
///
/// A wake that comes while the connection is running (between a reader finding nothing and
/// its suspending) is remembered, and the next `suspend` does not wait: the caller returns to
/// libmicrohttpd, which calls it again on its next turn and finds what the wake announced.
/// `MHD_suspend_connection` and `MHD_resume_connection` are called under the lock: they take
/// libmicrohttpd's own cleanup mutex, and libmicrohttpd never calls Portico while holding it.
final class Suspension: Sendable {
    /// The libmicrohttpd connection. Valid until `close` (its close notification); only
    /// `MHD_suspend_connection` (on its own thread) and `MHD_resume_connection` (any thread)
    /// are called with it here, under the lock, and never after `close`.
    struct Connection: @unchecked Sendable {
        let pointer: OpaquePointer
    }

    private struct State {
        var suspended = false
        var wakeRequested = false
        var closed = false
    }

    private let connection: Connection
    private let state = Mutex(State())

    init(connection: OpaquePointer) {
        self.connection = Connection(pointer: connection)
    }

    /// Suspends the connection unless a wake came first. Only on the connection's thread,
    /// inside one of its callbacks. Returns whether it is suspended.
    @discardableResult
    func suspend() -> Bool {
        state.withLock { state in
            if state.wakeRequested {
                state.wakeRequested = false
                return false
            }
            guard !state.closed, !state.suspended else { return state.suspended }
            state.suspended = true
            MHD_suspend_connection(connection.pointer)
            return true
        }
    }

    /// Resumes the connection if it is suspended, or makes the next `suspend` not wait. Any thread.
    func resume() {
        state.withLock { state in
            guard !state.closed else { return }
            if state.suspended {
                state.suspended = false
                MHD_resume_connection(connection.pointer)
            } else {
                state.wakeRequested = true
            }
        }
    }

    /// A new request on the connection: wakes meant for the previous one are forgotten.
    func reset() {
        state.withLock { $0.wakeRequested = false }
    }

    /// The connection is closed: nothing may resume it any more.
    func close() {
        state.withLock { $0.closed = true }
    }
}
