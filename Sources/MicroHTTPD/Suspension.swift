import CMicroHTTPD
import Synchronization

/// Suspends and resumes one connection, so that however many parties wake it — a handler's
/// answer, an upload's reader catching up, a response stream's next chunk, a client leaving —
/// libmicrohttpd resumes it exactly once per suspension and never after it closed.
///
/// A wake that comes while the connection is running (between a reader finding nothing and
/// its suspending) is remembered, and the next `suspend` does not wait: the caller returns to
/// libmicrohttpd, which calls it again on its next turn and finds what the wake announced.
///
/// One atomic, no lock: the connection's own thread suspends and the paired event loop resumes
/// on every proxied request, so a lock here would be one every request takes on two threads
/// (issue #33). `MHD_suspend_connection` is only called from `.running` by the connection's own
/// thread (which moves through `.suspending`), and `MHD_resume_connection` only by whoever moves
/// the state out of `.suspended` (or out of `.suspendingWoken`: the suspender itself), so each
/// suspension is resumed exactly once and never before `MHD_suspend_connection` returned.
final class Suspension: Sendable {
    /// The libmicrohttpd connection. Valid until `close` (its close notification); only
    /// `MHD_suspend_connection` (on its own thread) and `MHD_resume_connection` (any thread)
    /// are called with it here, never after `close`: a suspended connection is not closed by
    /// libmicrohttpd (the server resumes every one before stopping its daemons).
    struct Connection: @unchecked Sendable {
        let pointer: OpaquePointer
    }

    private enum Phase: Int {
        /// Running, no wake pending.
        case running
        /// Running, and a wake came: the next `suspend` returns at once.
        case woken
        /// The connection's thread is inside `MHD_suspend_connection`.
        case suspending
        /// A wake came while suspending: the suspender resumes it.
        case suspendingWoken
        case suspended
        case closed
    }

    private let connection: Connection
    private let phase = Atomic<Int>(Phase.running.rawValue)

    init(connection: OpaquePointer) {
        self.connection = Connection(pointer: connection)
    }

    private func exchange(_ expected: Phase, _ desired: Phase) -> Bool {
        phase.compareExchange(expected: expected.rawValue, desired: desired.rawValue, ordering: .acquiringAndReleasing).exchanged
    }

    private var current: Phase { Phase(rawValue: phase.load(ordering: .acquiring))! }

    /// Suspends the connection unless a wake came first. Only on the connection's thread,
    /// inside one of its callbacks. Returns whether it is suspended.
    @discardableResult
    func suspend() -> Bool {
        while true {
            switch current {
            case .woken:
                if exchange(.woken, .running) { return false }
            case .closed:
                return false
            case .suspended, .suspending, .suspendingWoken:
                return true
            case .running:
                guard exchange(.running, .suspending) else { continue }
                MHD_suspend_connection(connection.pointer)
                if exchange(.suspending, .suspended) { return true }
                // Woken while suspending: resumed here (libmicrohttpd calls again on its next turn).
                phase.store(Phase.running.rawValue, ordering: .releasing)
                MHD_resume_connection(connection.pointer)
                return true
            }
        }
    }

    /// Resumes the connection if it is suspended, or makes the next `suspend` not wait. Any thread.
    func resume() {
        while true {
            switch current {
            case .running:
                if exchange(.running, .woken) { return }
            case .suspending:
                if exchange(.suspending, .suspendingWoken) { return }
            case .suspended:
                if exchange(.suspended, .running) {
                    MHD_resume_connection(connection.pointer)
                    return
                }
            case .woken, .suspendingWoken, .closed:
                return
            }
        }
    }

    /// A new request on the connection: wakes meant for the previous one are forgotten.
    func reset() {
        _ = exchange(.woken, .running)
    }

    /// The connection is closed: nothing may resume it any more. Its own thread.
    func close() {
        phase.store(Phase.closed.rawValue, ordering: .releasing)
    }
}
