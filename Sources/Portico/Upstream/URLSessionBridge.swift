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
///
/// Failures are `URLSessionBridge.Failure`s, which each caller maps to its own error.
final class URLSessionBridge: Sendable {
    struct Received: Sendable {
        var response: HTTPURLResponse
        var body: ByteBuffer
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
    /// `nil` once shut down: URLSession traps on a task made after `invalidateAndCancel`, and a
    /// call can race a shutdown, so tasks are made and the session invalidated under one lock.
    private let session: Mutex<URLSession?>
    private let delegate = Delegate()

    /// A session with `URLSessionConfiguration.portico(backstopSeconds:)`.
    init(backstopSeconds: Int, maxConnectionsPerHost: Int? = nil) {
        let configuration = URLSessionConfiguration.portico(backstopSeconds: backstopSeconds)
        if let maxConnectionsPerHost { configuration.httpMaximumConnectionsPerHost = max(1, maxConnectionsPerHost) }
        backstop = configuration.timeoutIntervalForRequest
        session = Mutex(URLSession(configuration: configuration, delegate: delegate, delegateQueue: nil))
    }

    /// Sends `request`; returns the response and its body (at most `limit` bytes).
    func run(_ request: URLRequest, limit: Int) async throws -> Received {
        guard let task = session.withLock({ $0?.dataTask(with: request) }) else { throw Failure.shutDown }
        return try await delegate.run(task, limit: limit)
    }

    /// Cancels calls in flight and releases the session (it retains its delegate until then);
    /// safe to call more than once.
    func shutdown() {
        session.withLock { session in
            session?.invalidateAndCancel()
            session = nil
        }
    }
}

extension URLSessionBridge {
    /// Routes URLSession's delegate callbacks to the call waiting on each task. Sendable: its
    /// state is behind a `Mutex`; URLSession calls it from its own queue.
    final class Delegate: NSObject, URLSessionDataDelegate, Sendable {
        private let exchanges = Mutex<[Int: Exchange]>([:])

        func run(_ task: URLSessionDataTask, limit: Int) async throws -> Received {
            let exchange = Exchange(limit: limit)
            let id = task.taskIdentifier
            exchanges.withLock { $0[id] = exchange }
            defer { _ = exchanges.withLock { $0.removeValue(forKey: id) } }
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    if exchange.install(continuation) { task.resume() }
                }
            } onCancel: {
                // Resume now: never wait for URLSession to report the cancellation.
                exchange.finish(.failure(CancellationError()))
                task.cancel()
            }
        }

        private func exchange(for task: URLSessionTask) -> Exchange? {
            exchanges.withLock { $0[task.taskIdentifier] }
        }

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
            if let http = response as? HTTPURLResponse { exchange(for: dataTask)?.receive(http) }
            completionHandler(.allow)
        }

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
            guard let exchange = exchange(for: dataTask) else { return }
            if !exchange.receive(data) {
                exchange.finish(.failure(Failure.tooLarge(limit: exchange.limit)))
                dataTask.cancel()
            }
        }

        func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void) {
            completionHandler(nil)
        }

        /// The challenge is cancelled (the task then ends with -999, which the finished
        /// exchange ignores); the call completes with what was received.
        func urlSession(_ session: URLSession, task: URLSessionTask, didReceive challenge: URLAuthenticationChallenge,
                        completionHandler: @escaping @Sendable (URLSession.AuthChallengeDisposition, URLCredential?) -> Void) {
            if let exchange = exchange(for: task), !exchange.finishWithReceived() {
                exchange.finish(.failure(Failure.challengeWithoutResponse))
            }
            completionHandler(.cancelAuthenticationChallenge, nil)
        }

        func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
            guard let exchange = exchange(for: task) else { return }
            if let error {
                // curl's "partial file" (closed mid-body) arrives as URLError -1 (unknown).
                if exchange.isTruncated {
                    exchange.finish(.failure(Failure.truncated))
                    return
                }
                exchange.finish(.failure(Failure.transport(error, hadResponse: exchange.hasResponse)))
            } else if !exchange.finishWithReceived() {
                exchange.finish(.failure(Failure.noResponse))
            }
        }
    }

    /// One call. All state behind a Mutex: delegate callbacks arrive on URLSession's queue
    /// while cancellation arrives from the awaiting task.
    final class Exchange: Sendable {
        struct State {
            var continuation: CheckedContinuation<Received, any Error>?
            var result: Result<Received, any Error>?
            var response: HTTPURLResponse?
            var body = ByteBuffer()
        }

        let limit: Int
        let state = Mutex(State())

        init(limit: Int) { self.limit = limit }

        /// Installs the waiter; returns false when the exchange already finished (cancelled early).
        func install(_ continuation: CheckedContinuation<Received, any Error>) -> Bool {
            let finished: Result<Received, any Error>? = state.withLock { state in
                if let result = state.result { return result }
                state.continuation = continuation
                return nil
            }
            if let finished {
                continuation.resume(with: finished)
                return false
            }
            return true
        }

        /// Completes the exchange once; later calls are ignored.
        func finish(_ result: Result<Received, any Error>) {
            let continuation: CheckedContinuation<Received, any Error>? = state.withLock { state in
                guard state.result == nil else { return nil }
                state.result = result
                defer { state.continuation = nil }
                return state.continuation
            }
            continuation?.resume(with: result)
        }

        /// Completes with what was received so far (used on the 401 challenge and on completion).
        func finishWithReceived() -> Bool {
            let received: Received? = state.withLock { state in
                state.response.map { Received(response: $0, body: state.body) }
            }
            guard let received else { return false }
            finish(.success(received))
            return true
        }

        func receive(_ response: HTTPURLResponse) {
            state.withLock { state in
                // A redirect we refused or an interim response may come first: the last one wins.
                state.response = response
                state.body.clear()
            }
        }

        /// Appends body bytes; false once the limit is passed.
        func receive(_ data: Data) -> Bool {
            state.withLock { state in
                guard state.result == nil else { return true }
                state.body.writeBytes(data)
                return state.body.readableBytes <= limit
            }
        }

        var hasResponse: Bool { state.withLock { $0.response != nil } }

        /// Fewer body bytes than an unencoded response's `Content-Length` announced.
        var isTruncated: Bool {
            state.withLock { state in
                guard let response = state.response, response.value(forHTTPHeaderField: "Content-Encoding") == nil,
                      let declared = response.value(forHTTPHeaderField: "Content-Length").flatMap({ Int($0) })
                else { return false }
                return state.body.readableBytes < declared
            }
        }
    }
}
