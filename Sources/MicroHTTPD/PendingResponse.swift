import CMicroHTTPD
import Synchronization

/// A suspended connection waiting for its handler. Completion is idempotent: the first of
/// handler, deadline watchdog or shutdown to answer wins, and the connection is resumed
/// exactly once.
final class PendingResponse: Sendable {
    /// The libmicrohttpd connection, valid until it is resumed and its request completes.
    /// `MHD_resume_connection` may be called from any thread; nothing else touches it here.
    struct Connection: @unchecked Sendable {
        let pointer: OpaquePointer
    }

    private struct State {
        var response: ServerResponse?
        var task: Task<Void, Never>?
    }

    let connection: Connection
    let deadline: ContinuousClock.Instant
    let isHead: Bool
    /// The handler's name for the request, for the server's own answers.
    let requestID: String?
    private let state = Mutex(State())
    private let onComplete: @Sendable (PendingResponse) -> Void

    init(connection: OpaquePointer, deadline: ContinuousClock.Instant, isHead: Bool, requestID: String?,
         onComplete: @escaping @Sendable (PendingResponse) -> Void) {
        self.connection = Connection(pointer: connection)
        self.deadline = deadline
        self.isHead = isHead
        self.requestID = requestID
        self.onComplete = onComplete
    }

    func attach(_ task: Task<Void, Never>) {
        let alreadyDone = state.withLock { state -> Bool in
            state.task = task
            return state.response != nil
        }
        if alreadyDone { task.cancel() }
    }

    /// Sets the response and resumes the connection, unless another answer came first;
    /// `beforeResume` runs (for the winner only) just before the connection is resumed.
    @discardableResult
    func complete(_ response: ServerResponse, beforeResume: () -> Void = {}) -> Bool {
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
        task?.cancel()
        onComplete(self)
        beforeResume()
        MHD_resume_connection(connection.pointer)
        return true
    }

    /// The response, once completed.
    var response: ServerResponse? { state.withLock { $0.response } }
}
