import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import NIOCore
import Synchronization

/// The one bridge from URLSession to async callers, shared by the `urlsession` upstream
/// transport and the token endpoint client: a session with Portico's configuration, driven
/// through a `URLSessionDataDelegate` so redirects, auth challenges, body limits and
/// cancellation are ours.
///
/// - Redirects are not followed: the 3xx is the response (a gateway passes them through; a
///   token call never sends its secret to another host).
/// - A 401 with `WWW-Authenticate: Basic` hangs the task forever on Linux (6.3.1) once the
///   challenge is handled any other way; its head and body have already arrived through the
///   data delegate, so the call completes with them and the challenge is cancelled.
/// - Cancelling the awaiting task finishes the call at once, without waiting for URLSession.
/// - A call with `Streaming` hands over a large or undeclared body as a `BodyStream` as soon
///   as the head is there. FoundationNetworking gives no backpressure (measured: `suspend()`
///   on a running data task drops the connection and `resume()` sends the request again), so
///   chunks are queued as they come; `limit` bounds what one stream can hold. (Foundation hands
///   data to the delegate through its delegate queue, so curl can read ahead of what this
///   bridge has seen; what it read before a cancellation lands is delivered, then dropped.)
///
/// Failures are `URLSessionBridge.Failure`s, which each caller maps to its own error.
final class URLSessionBridge: Sendable {
    struct Received: Sendable {
        var response: HTTPURLResponse
        var body: ByteBuffer
    }

    /// What a call hands over once the head is there.
    enum Head: Sendable {
        /// The response with its whole body.
        case whole(Received)
        /// The response; its body flows through the stream as it arrives.
        case streaming(HTTPURLResponse, BodyStream)
    }

    /// How a response's body is handed over, decided at its head.
    enum Framing: Sendable, Equatable {
        case whole
        /// Streamed, declaring `length` bytes when it is known.
        case stream(length: Int?)
    }

    /// What a call that may stream needs: when to stream, the stream's timeouts, and its
    /// failures after the head as the reader will see them.
    struct Streaming: Sendable {
        var framing: @Sendable (HTTPURLResponse) -> Framing
        var clock: any GatewayClock
        var idle: Duration
        var maxDuration: Duration?
        var failure: @Sendable (Failure) -> GatewayError
    }

    enum Failure: Error {
        /// The body passed the call's limit.
        case tooLarge(limit: Int)
        /// An authentication challenge came before any response.
        case challengeWithoutResponse
        /// The task ended without an error and without a response.
        case noResponse
        /// Fewer body bytes than an unencoded response's `Content-Length` announced.
        case truncated
        /// The bridge was shut down: no more calls.
        case shutDown
        /// URLSession's own error (a `URLError`, usually), and whether a response head had arrived.
        case transport(any Error, hadResponse: Bool)
    }

    /// URLSession's own timeout, a backstop behind the caller's deadline.
    let backstop: TimeInterval
    /// URLSession traps on a task made after `invalidateAndCancel`, and a call can race a
    /// shutdown. Tasks are made outside the lock (`dataTask(with:)` waits on the session's own
    /// queue: made under the lock, concurrent calls queued behind one another on it, measured
    /// 3 % of the CPU spinning for it); the lock counts the calls making one, and the session is
    /// invalidated once the last of them is done.
    private let session: Mutex<SessionState>
    /// How the session ends.
    enum Invalidation: Equatable {
        /// Calls in flight are cancelled (`shutdown`).
        case cancelling
        /// Calls in flight finish; no new ones (a reload retired the upstream).
        case finishingTasks
    }
    private struct SessionState {
        /// `nil` once invalidated.
        var session: URLSession?
        /// Calls making a task on `session` right now.
        var makingTasks = 0
        /// Set by the first shutdown: the last call making a task, or the shutdown itself when
        /// none is, invalidates the session.
        var invalidation: Invalidation?
        /// A session left to finish its tasks, kept so that a later `shutdown` can cancel them.
        var finishing: URLSession?

        /// The session to invalidate now — shut down, and no task being made on it — which
        /// is no longer handed out; `nil` otherwise.
        mutating func takeForInvalidation() -> (URLSession, Invalidation)? {
            guard let invalidation, makingTasks == 0, let taken = session else { return nil }
            session = nil
            if invalidation == .finishingTasks { finishing = taken }
            return (taken, invalidation)
        }
    }

    private static func invalidate(_ taken: (URLSession, Invalidation)?) {
        switch taken {
        case nil: return
        case (let session, .cancelling)?: session.invalidateAndCancel()
        case (let session, .finishingTasks)?: session.finishTasksAndInvalidate()
        }
    }
    private let delegate = Delegate()
    /// Where the delegate's callbacks run (see `init`).
    private let callbackQueue = DispatchQueue(label: "portico.urlsession.delegate")

    /// A session with `URLSessionConfiguration.portico(backstopSeconds:)`.
    init(backstopSeconds: Int, maxConnectionsPerHost: Int? = nil) {
        let configuration = URLSessionConfiguration.portico(backstopSeconds: backstopSeconds)
        if let maxConnectionsPerHost { configuration.httpMaximumConnectionsPerHost = max(1, maxConnectionsPerHost) }
        backstop = configuration.timeoutIntervalForRequest
        // Delegate callbacks one at a time, as URLSession's own default queue does, but run on a
        // serial dispatch queue of their own: FoundationNetworking's default `OperationQueue`
        // schedules each operation through its own bookkeeping (measured: 8-11 % less CPU per
        // request this way, bench/RESULTS.md, session 9).
        let delegateQueue = OperationQueue()
        delegateQueue.maxConcurrentOperationCount = 1
        delegateQueue.underlyingQueue = callbackQueue  // not retained by the OperationQueue: kept here
        session = Mutex(SessionState(session: URLSession(configuration: configuration, delegate: delegate,
                                                         delegateQueue: delegateQueue)))
    }

    /// Sends `request`; returns the response and its body (at most `limit` bytes).
    func run(_ request: URLRequest, limit: Int) async throws -> Received {
        guard case .whole(let received) = try await open(request, limit: limit, streaming: nil) else {
            preconditionFailure("a call without streaming options streamed")
        }
        return received
    }

    /// Sends `request`; returns once the head is there, with the whole body or, when
    /// `streaming.framing` says so, a stream of it (at most `limit` bytes either way).
    func open(_ request: URLRequest, limit: Int, streaming: Streaming?) async throws -> Head {
        let current = session.withLock { state -> URLSession? in
            guard let session = state.session, state.invalidation == nil else { return nil }
            state.makingTasks += 1
            return session
        }
        guard let current else { throw Failure.shutDown }
        let task = current.dataTask(with: request)
        let invalidation = session.withLock { state -> (URLSession, Invalidation)? in
            state.makingTasks -= 1
            return state.takeForInvalidation()
        }
        // Shut down while this task was being made: it is cancelled with the others (or, when
        // retired, runs to its end with them).
        Self.invalidate(invalidation)
        return try await delegate.run(task, limit: limit, streaming: streaming)
    }

    /// Cancels calls in flight and releases the session (it retains its delegate until then);
    /// with `finishingTasks`, lets them finish instead (a reload's retirement). Safe to call more
    /// than once: a shutdown after a retirement cancels what still runs. With tasks being made
    /// right now, the last of those calls invalidates it.
    func shutdown(finishingTasks: Bool = false) {
        let (taken, stillFinishing) = session.withLock { state -> ((URLSession, Invalidation)?, URLSession?) in
            switch (state.invalidation, finishingTasks) {
            case (nil, _):
                state.invalidation = finishingTasks ? .finishingTasks : .cancelling
                return (state.takeForInvalidation(), nil)
            case (.finishingTasks?, false):
                state.invalidation = .cancelling
                defer { state.finishing = nil }
                return (state.takeForInvalidation(), state.finishing)
            default:
                return (nil, nil)
            }
        }
        Self.invalidate(taken)
        stillFinishing?.getAllTasks { tasks in
            for task in tasks { task.cancel() }
        }
    }
}
