import CMicroHTTPD
import Synchronization

/// A request handed to its handler, its connection suspended while it waits (or still reading
/// a streamed body). Completion is idempotent: the first of handler, deadline watchdog,
/// hang-up or shutdown to answer wins, and the connection is woken once.
///
/// No lock: the connection's thread creates it and reads the answer, the paired event loop
/// completes it — on every proxied request — so its state is atomics (issue #33).
/// `@unchecked Sendable`: `answer` is written once, by the completer that won the `flags`
/// exchange, before it publishes `answered` (releasing); it is read only after `answered` is seen
/// (acquiring). `task` is written once by `attach` before it sets `taskAttached` in `flags`, and
/// read only by a completer whose exchange of `flags` saw that bit.
final class PendingResponse: @unchecked Sendable {
    private static let completedByWork = 1
    private static let completedOtherwise = 2
    private static let taskAttached = 4

    private let flags = Atomic<Int>(0)
    private let answered = Atomic<Bool>(false)
    private var answer: ServerResponse?
    private var task: Task<Void, Never>?
    private let deadlineNanoseconds: Atomic<Int64>

    let suspension: Suspension
    let isHead: Bool
    /// The handler's name for the request, for the server's own answers.
    let requestID: String?
    private let onComplete: @Sendable (PendingResponse) -> Void

    init(suspension: Suspension, deadline: ContinuousClock.Instant, isHead: Bool, requestID: String?,
         onComplete: @escaping @Sendable (PendingResponse) -> Void) {
        self.suspension = suspension
        self.isHead = isHead
        self.requestID = requestID
        self.onComplete = onComplete
        self.deadlineNanoseconds = Atomic(MonotonicTime.nanoseconds(deadline))
    }

    /// When the server answers for the handler (the watchdog's 504).
    var deadline: ContinuousClock.Instant {
        get { MonotonicTime.instant(deadlineNanoseconds.load(ordering: .relaxed)) }
        set { deadlineNanoseconds.store(MonotonicTime.nanoseconds(newValue), ordering: .relaxed) }
    }

    /// The work's task, cancelled if something else answers first. Once, right after it is made.
    func attach(_ task: Task<Void, Never>) {
        self.task = task
        let before = flags.bitwiseOr(Self.taskAttached, ordering: .acquiringAndReleasing).oldValue
        if before & Self.completedOtherwise != 0 { task.cancel() }
    }

    /// Sets the response and resumes the connection, unless another answer came first;
    /// `beforeResume` runs (for the winner only) just before the connection is resumed. The
    /// work's task is cancelled unless it is what answers (`byWork`): cancelling a task costs a
    /// walk of its status records under a lock.
    @discardableResult
    func complete(_ response: ServerResponse, byWork: Bool = false, beforeResume: () -> Void = {}) -> Bool {
        let mark = byWork ? Self.completedByWork : Self.completedOtherwise
        let before = flags.bitwiseOr(mark, ordering: .acquiringAndReleasing).oldValue
        guard before & (Self.completedByWork | Self.completedOtherwise) == 0 else { return false }
        answer = response
        answered.store(true, ordering: .releasing)
        if !byWork && before & Self.taskAttached != 0 { task?.cancel() }
        onComplete(self)
        beforeResume()
        suspension.resume()
        return true
    }

    /// The response, once completed.
    var response: ServerResponse? { answered.load(ordering: .acquiring) ? answer : nil }

    /// Whether something has answered (its response may be a moment from being readable).
    var isOver: Bool { flags.load(ordering: .acquiring) & (Self.completedByWork | Self.completedOtherwise) != 0 }
}

extension PendingResponse: HangUpListener {
    /// The work is cancelled and the socket shut down before the connection is woken, so
    /// libmicrohttpd closes it (the answer goes nowhere, not even to a client that only half-closed).
    func clientLeft(timer: ConnectionTimer) -> Bool {
        complete(Self.abandoned, beforeResume: { timer.shutDown() })
    }

    /// What completes a request whose client has gone (never sent: its connection is closing).
    static let abandoned = ServerResponse(status: 499, body: Array("client closed the connection\n".utf8),
                                          closeConnection: true)
}
