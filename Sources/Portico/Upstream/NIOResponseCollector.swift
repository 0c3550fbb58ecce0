import AsyncHTTPClient
import NIOCore
import NIOHTTP1
import Synchronization

/// Receives one upstream response from AsyncHTTPClient on its event loop and hands it to the
/// waiting gateway task: a small one (declared length up to `Body.bufferedLimit`) collected whole,
/// as before; a larger or undeclared one as a `Body(stream:)` right after its head, its bytes
/// relayed by a `StreamedResponseRelay` with backpressure (a paused relay leaves the
/// `didReceiveBodyPart` future pending, and AsyncHTTPClient stops reading the connection).
///
/// The head deadline is ours, not AsyncHTTPClient's (whose deadline covers the whole exchange,
/// body included, and would cut a long stream): armed by `start` (or, for a streamed request
/// body, when the upload ends), it cancels the exchange if no head came in time; a buffered
/// response stays under it to its end, as before; a streamed one leaves it at the head.
final class NIOResponseCollector: HTTPClientResponseDelegate {
    typealias Response = Void

    private enum Phase {
        case awaitingHead
        case buffering(HTTPResponseHead, ByteBuffer?)
        case streaming(StreamedResponseRelay)
        case done
    }

    private struct State {
        var phase = Phase.awaitingHead
        var waiter: CheckedContinuation<GatewayResponse, any Error>?
        /// The outcome when it came before anyone waited (held only until taken: a streamed
        /// body must not be kept alive here once the gateway lets go of it).
        var outcome: Result<GatewayResponse, any Error>?
        var delivered = false
        var task: HTTPClient.Task<Void>?
        var headTimer: Scheduled<Void>?
        /// The budget for the head, once the timer may start (`start`, or the upload's end).
        var budget: Duration?
        /// When the head must be here (the budget from `start`; from the upload's end with one).
        var deadline: NIODeadline?
        var timerMayStart = false
        var timedOut = false
        var headReceived = false
        /// The request head went out (the event loop arms the timer then, without a thread hop).
        var headSent = false
    }

    private let limit: Int
    private let requestIsHead: Bool
    private let upstream: String
    private let context: RequestContext
    // Only the task's event loop calls the delegate, one callback at a time; the lock is
    // uncontended and there for the waiting task and the timer.
    private let state = Mutex(State())

    init(limit: Int, requestIsHead: Bool, upstream: String, context: RequestContext) {
        self.limit = limit
        self.requestIsHead = requestIsHead
        self.upstream = upstream
        self.context = context
    }

    /// Whether the response head arrived, so a failure is a reset mid-body rather than a failed connect.
    var afterHead: Bool { state.withLock { $0.headReceived } }

    /// Takes the running task; `headBudget` bounds the wait for the head from now, or with
    /// `afterUpload` from `uploadEnded()`.
    ///
    /// Nothing here hops to the event loop on the request path: failures arrive through
    /// `didReceiveError`, and the timer is armed on the loop when the request head goes out
    /// (`didSendRequestHead`), against a deadline fixed now. Only when the head went out before
    /// this call (or the upload ends later) is it armed from here.
    func start(_ task: HTTPClient.Task<Void>, headBudget: Duration, afterUpload: Bool) {
        let deadline = NIODeadline.now() + TimeAmount(headBudget)
        let arm = state.withLock { state -> Bool in
            state.task = task
            state.budget = headBudget
            state.deadline = deadline
            if !afterUpload { state.timerMayStart = true }
            return state.timerMayStart && state.headSent
        }
        if arm { armHeadTimer() }
    }

    /// The streamed request body was sent: the head deadline starts now.
    func uploadEnded() {
        let arm = state.withLock { state -> Bool in
            state.timerMayStart = true
            if let budget = state.budget { state.deadline = .now() + TimeAmount(budget) }
            return state.task != nil
        }
        if arm { armHeadTimer() }
    }

    /// The response: buffered when complete, streamed once its head is here.
    func response() async throws -> GatewayResponse {
        try await withCheckedThrowingContinuation { continuation in
            let ready = state.withLock { state -> Result<GatewayResponse, any Error>? in
                if let outcome = state.outcome {
                    state.outcome = nil
                    return outcome
                }
                state.waiter = continuation
                return nil
            }
            if let ready { continuation.resume(with: ready) }
        }
    }

    // MARK: Delegate

    func didSendRequestHead(task: HTTPClient.Task<Void>, _ head: HTTPRequestHead) {
        let arm = state.withLock { state -> Bool in
            state.headSent = true
            return state.timerMayStart && state.task != nil
        }
        if arm { armHeadTimer() }
    }

    func didReceiveError(task: HTTPClient.Task<Void>, _ error: any Error) {
        failed(error)
    }

    func didReceiveHead(task: HTTPClient.Task<Void>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
        state.withLock { $0.headReceived = true }
        switch ResponseBodyPlan(head: head, requestIsHead: requestIsHead, limit: limit) {
        case .buffer:
            state.withLock { $0.phase = .buffering(head, nil) }
        case .tooLarge:
            return task.eventLoop.makeFailedFuture(NIOTooManyBytesError(maxBytes: limit))
        case .stream(let length):
            let relay = StreamedResponseRelay(length: length, limit: limit, upstream: upstream, context: context) {
                task.cancel()
            }
            let timer = state.withLock { state in
                state.phase = .streaming(relay)
                defer { state.headTimer = nil }
                return state.headTimer
            }
            timer?.cancel()
            deliver(.success(NIOUpstream.makeResponse(head, body: Body(stream: relay.stream))))
        }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didReceiveBodyPart(task: HTTPClient.Task<Void>, _ part: ByteBuffer) -> EventLoopFuture<Void> {
        enum Next { case collected, relay(StreamedResponseRelay), overLimit }
        let next = state.withLock { state -> Next in
            switch state.phase {
            case .buffering(let head, var body):
                guard (body?.readableBytes ?? 0) + part.readableBytes <= limit else { return .overLimit }
                if body == nil {
                    body = part  // the common single-part body: no copy
                } else {
                    state.phase = .done  // drop the reference so the append does not copy
                    body!.writeImmutableBuffer(part)
                }
                state.phase = .buffering(head, body)
                return .collected
            case .streaming(let relay):
                return .relay(relay)
            case .awaitingHead, .done:
                return .collected
            }
        }
        switch next {
        case .collected:
            return task.eventLoop.makeSucceededVoidFuture()
        case .overLimit:
            return task.eventLoop.makeFailedFuture(NIOTooManyBytesError(maxBytes: limit))
        case .relay(let relay):
            let resumed = task.eventLoop.makePromise(of: Void.self)
            switch relay.deliver(part, resume: { resumed.succeed() }) {
            case .proceed:
                resumed.succeed()
            case .pause:
                break
            case .stop:
                resumed.fail(NIOTooManyBytesError(maxBytes: limit))  // the relay has told the reader
            }
            return resumed.futureResult
        }
    }

    func didFinishRequest(task: HTTPClient.Task<Void>) throws {
        let (phase, timer) = state.withLock { state in
            defer { (state.phase, state.headTimer, state.task) = (.done, nil, nil) }
            return (state.phase, state.headTimer)
        }
        timer?.cancel()
        switch phase {
        case .buffering(let head, let body):
            deliver(.success(NIOUpstream.makeResponse(head, body: Body(body ?? ByteBuffer()))))
        case .streaming(let relay):
            relay.finish()
        case .awaitingHead, .done:
            deliver(.failure(UpstreamError.protocolError("no response head")))
        }
    }

    // MARK: Failure and the head deadline

    private func failed(_ error: any Error) {
        let (phase, timer, timedOut) = state.withLock { state in
            defer { (state.phase, state.headTimer, state.task) = (.done, nil, nil) }
            return (state.phase, state.headTimer, state.timedOut)
        }
        timer?.cancel()
        if case .streaming(let relay) = phase {
            relay.fail(error)
        } else {
            deliver(.failure(timedOut ? UpstreamError.timeout : error))
        }
    }

    private func armHeadTimer() {
        state.withLock { state in
            guard let task = state.task, let deadline = state.deadline, state.headTimer == nil else { return }
            switch state.phase {
            case .awaitingHead, .buffering:
                state.headTimer = task.eventLoop.scheduleTask(deadline: deadline) { [self] in timeOut() }
            case .streaming, .done:
                break
            }
        }
    }

    private func timeOut() {
        let task = state.withLock { state -> HTTPClient.Task<Void>? in
            switch state.phase {
            case .awaitingHead, .buffering:
                state.timedOut = true
                return state.task
            case .streaming, .done:
                return nil
            }
        }
        task?.cancel()
    }

    private func deliver(_ outcome: Result<GatewayResponse, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<GatewayResponse, any Error>? in
            guard !state.delivered else { return nil }
            state.delivered = true
            guard let waiter = state.waiter else {
                state.outcome = outcome
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume(with: outcome)
    }
}
