import CMicroHTTPD
import Synchronization

/// A request handed to its handler, its connection suspended while it waits (or still reading
/// a streamed body). Completion is idempotent: the first of handler, deadline watchdog,
/// hang-up or shutdown to answer wins, and the connection is woken once.
final class PendingResponse: Sendable {
    private struct State {
        var response: ServerResponse?
        var task: Task<Void, Never>?
        var deadline: ContinuousClock.Instant
    }

    let suspension: Suspension
    let isHead: Bool
    /// The handler's name for the request, for the server's own answers.
    let requestID: String?
    private let state: Mutex<State>
    private let onComplete: @Sendable (PendingResponse) -> Void

    init(suspension: Suspension, deadline: ContinuousClock.Instant, isHead: Bool, requestID: String?,
         onComplete: @escaping @Sendable (PendingResponse) -> Void) {
        self.suspension = suspension
        self.isHead = isHead
        self.requestID = requestID
        self.onComplete = onComplete
        self.state = Mutex(State(deadline: deadline))
    }

    /// When the server answers for the handler (the watchdog's 504).
    var deadline: ContinuousClock.Instant {
        get { state.withLock { $0.deadline } }
        set { state.withLock { $0.deadline = newValue } }
    }

    func attach(_ task: Task<Void, Never>) {
        let alreadyDone = state.withLock { state -> Bool in
            state.task = task
            return state.response != nil
        }
        if alreadyDone { task.cancel() }
    }

    /// Sets the response and resumes the connection, unless another answer came first;
    /// `beforeResume` runs (for the winner only) just before the connection is resumed. The
    /// work's task is cancelled unless it is what answers (`byWork`): cancelling a task costs a
    /// walk of its status records under a lock.
    @discardableResult
    func complete(_ response: ServerResponse, byWork: Bool = false, beforeResume: () -> Void = {}) -> Bool {
        let task: Task<Void, Never>?
        do {
            let won = state.withLock { state -> (Bool, Task<Void, Never>?) in
                guard state.response == nil else { return (false, nil) }
                state.response = response
                return (true, state.task)
            }
            guard won.0 else { return false }
            task = won.1
        }
        if !byWork { task?.cancel() }
        onComplete(self)
        beforeResume()
        suspension.resume()
        return true
    }

    /// The response, once completed.
    var response: ServerResponse? { state.withLock { $0.response } }
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

    var isOver: Bool { response != nil }
}
