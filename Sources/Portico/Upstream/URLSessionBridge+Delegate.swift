import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import NIOCore
import Synchronization

// URLSession's side of the bridge: the delegate that receives every callback of every task and
// the per-task `Transfer` it routes them to (head, body chunks or buffer, limits, completion).

extension URLSessionBridge {
    /// Routes URLSession's delegate callbacks to the call waiting on each task. Sendable: its
    /// state is behind a `Mutex`; URLSession calls it from its own queue.
    final class Delegate: NSObject, URLSessionDataDelegate, Sendable {
        private let exchanges = Mutex<[Int: Transfer]>([:])

        func run(_ task: URLSessionDataTask, limit: Int, streaming: Streaming?) async throws -> Head {
            let exchange = Transfer(limit: limit, streaming: streaming)
            let id = task.taskIdentifier
            exchanges.withLock { $0[id] = exchange }
            let head: Head
            do {
                head = try await withTaskCancellationHandler {
                    try await withCheckedThrowingContinuation { continuation in
                        if exchange.install(continuation) { task.resume() }
                    }
                } onCancel: {
                    // Resume now: never wait for URLSession to report the cancellation.
                    exchange.finish(.failure(CancellationError()))
                    task.cancel()
                }
            } catch {
                _ = exchanges.withLock { $0.removeValue(forKey: id) }
                throw error
            }
            // A streaming exchange goes on until the task completes, and leaves then.
            if case .whole = head { _ = exchanges.withLock { $0.removeValue(forKey: id) } }
            return head
        }

        private func exchange(for task: URLSessionTask) -> Transfer? {
            exchanges.withLock { $0[task.taskIdentifier] }
        }

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
            if let http = response as? HTTPURLResponse { exchange(for: dataTask)?.receive(http, task: dataTask) }
            completionHandler(.allow)
        }

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
            exchange(for: dataTask)?.receive(data, task: dataTask)
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
            if exchange.isStreaming {
                exchange.endStream(after: error)
                _ = exchanges.withLock { $0.removeValue(forKey: task.taskIdentifier) }
                return
            }
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
    /// while cancellation arrives from the awaiting task, and a stream's reader goes away (or
    /// its watchdog expires) on threads of its own.
    final class Transfer: Sendable {
        /// Where the call is. Each case carries what it needs, so no combination of fields can
        /// say two things at once.
        enum Phase {
            /// No usable head yet, or one whose body is being collected whole. `waiter` is the
            /// awaiting caller once installed. A redirect we refused or an interim response may
            /// come first: the last `response` wins, and `body` restarts with it.
            case receiving(waiter: CheckedContinuation<Head, any Error>?, response: HTTPURLResponse?,
                           body: ByteBuffer, declaredLength: Int?)
            /// The call completed (a whole body or a failure); later callbacks are ignored. Kept
            /// for a waiter installed after an early cancellation.
            case finished(Result<Head, any Error>)
            /// The head went to the caller and the body streams to `writer`; `received` bytes
            /// so far, counted against `limit`.
            case streaming(writer: BodyWriter, watchdog: StreamWatchdog, received: Int, declaredLength: Int?)
            /// The streamed body ended (finished or failed).
            case streamEnded
        }

        let limit: Int
        let streaming: Streaming?
        let phase = Mutex(Phase.receiving(waiter: nil, response: nil, body: ByteBuffer(), declaredLength: nil))

        init(limit: Int, streaming: Streaming? = nil) {
            self.limit = limit
            self.streaming = streaming
        }

        /// Installs the waiter; returns false when the exchange already finished (cancelled early).
        func install(_ continuation: CheckedContinuation<Head, any Error>) -> Bool {
            let finished: Result<Head, any Error>? = phase.withLock { phase in
                switch phase {
                case .receiving(_, let response, let body, let declaredLength):
                    phase = .receiving(waiter: continuation, response: response, body: body, declaredLength: declaredLength)
                    return nil
                case .finished(let result):
                    return result
                case .streaming, .streamEnded:
                    preconditionFailure("the task streams only once resumed, after its waiter is installed")
                }
            }
            if let finished {
                continuation.resume(with: finished)
                return false
            }
            return true
        }

        /// Completes the call once, unless its body already streams; later calls are ignored.
        func finish(_ result: Result<Head, any Error>) {
            let waiter: CheckedContinuation<Head, any Error>? = phase.withLock { phase in
                guard case .receiving(let waiter, _, _, _) = phase else { return nil }
                phase = .finished(result)
                return waiter
            }
            waiter?.resume(with: result)
        }

        /// Completes with what was received so far (used on the 401 challenge and on
        /// completion). False: no response head came.
        func finishWithReceived() -> Bool {
            let received: Received?? = phase.withLock { phase in
                guard case .receiving(_, let response, let body, _) = phase else { return .some(nil) }
                return response.map { Received(response: $0, body: body) }
            }
            switch received {
            case nil: return false
            case .some(nil): return true  // completed already
            case .some(let received?):
                finish(.success(.whole(received)))
                return true
            }
        }

        func receive(_ response: HTTPURLResponse, task: URLSessionDataTask) {
            let declared = Self.unencodedLength(response)
            let receiving: Bool = phase.withLock { phase in
                guard case .receiving(let waiter, _, _, _) = phase else { return false }
                phase = .receiving(waiter: waiter, response: response, body: ByteBuffer(), declaredLength: declared)
                return true
            }
            guard receiving else { return }
            let status = response.statusCode
            let hasBody = HTTPSyntax.responseHasBody(status: status, toHead: task.originalRequest?.httpMethod == "HEAD")
            if hasBody, let declared, declared > limit {
                // Refused at the head: a declared length over the limit is never read.
                finish(.failure(Failure.tooLarge(limit: limit)))
                task.cancel()
                return
            }
            guard let streaming, case .stream(let length) = streaming.framing(response) else { return }
            let (stream, writer) = BodyStream.makeStream(length: length)
            let watchdog = StreamWatchdog(clock: streaming.clock, idle: streaming.idle, maxDuration: streaming.maxDuration) {
                [weak self] error in
                self?.endStream(failing: error)
                task.cancel()
            }
            let started: CheckedContinuation<Head, any Error>?? = phase.withLock { phase in
                // Cancelled meanwhile: the reader is gone, the stream never starts.
                guard case .receiving(let waiter, _, _, _) = phase else { return nil }
                phase = .streaming(writer: writer, watchdog: watchdog, received: 0, declaredLength: declared)
                return .some(waiter)
            }
            guard let waiter = started else {
                watchdog.stop()
                task.cancel()
                return
            }
            writer.onReaderGone { [weak self] error in
                self?.endStream(failing: error)
                task.cancel()
            }
            waiter?.resume(returning: .streaming(response, stream))
        }

        /// Collects body bytes, or passes them on to the stream; past `limit` the call fails
        /// and the task is cancelled.
        func receive(_ data: Data, task: URLSessionDataTask) {
            enum Step {
                case kept, tooLarge, ignored
                case offer(BodyWriter, StreamWatchdog)
                case streamTooLarge
            }
            let step: Step = phase.withLock { phase in
                switch phase {
                case .streaming(let writer, let watchdog, let received, let declaredLength):
                    let total = received + data.count
                    phase = .streaming(writer: writer, watchdog: watchdog, received: total, declaredLength: declaredLength)
                    return total > limit ? .streamTooLarge : .offer(writer, watchdog)
                case .receiving(let waiter, let response, var body, let declaredLength):
                    // Moved out of the phase while it grows, so the buffer is not copied (copy on write).
                    phase = .streamEnded
                    body.writeBytes(data)
                    let size = body.readableBytes
                    phase = .receiving(waiter: waiter, response: response, body: body, declaredLength: declaredLength)
                    return size <= limit ? .kept : .tooLarge
                case .finished, .streamEnded:
                    return .ignored
                }
            }
            switch step {
            case .kept, .ignored:
                break
            case .tooLarge:
                finish(.failure(Failure.tooLarge(limit: limit)))
                task.cancel()
            case .streamTooLarge:
                endStream(failing: streaming?.failure(.tooLarge(limit: limit)))
                task.cancel()
            case .offer(let writer, let watchdog):
                watchdog.touch()
                var chunk = ByteBuffer()
                chunk.writeBytes(data)
                // No pause on `.full`: URLSession has none that keeps the connection (see the
                // type's notes), so the queue grows, bounded by `limit`.
                if writer.offer(chunk, resume: {}) == .readerGone {
                    endStream(failing: .clientClosedRequest())
                    task.cancel()
                }
            }
        }

        /// Whether the body was handed over as a stream (true after it ended too).
        var isStreaming: Bool {
            phase.withLock { phase in
                switch phase {
                case .streaming, .streamEnded: true
                case .receiving, .finished: false
                }
            }
        }

        /// The task completed while streaming: finish the stream, or fail it with what happened.
        func endStream(after error: (any Error)?) {
            guard let streaming else { return }
            let short = phase.withLock { phase in
                guard case .streaming(_, _, let received, let declared?) = phase else { return false }
                return received < declared
            }
            if let error {
                // curl's "partial file" / a reset arrive as URLError -1 or -1005; a timeout is its own.
                let failure: Failure = (error as? URLError)?.code == .timedOut
                    ? .transport(error, hadResponse: true) : .truncated
                endStream(failing: streaming.failure(failure))
            } else if short {
                endStream(failing: streaming.failure(.truncated))
            } else {
                endStream(failing: nil)
            }
        }

        /// Ends the stream once: finished (`nil`) or failed; stops its watchdog.
        func endStream(failing error: GatewayError?) {
            let ended: (BodyWriter, StreamWatchdog)? = phase.withLock { phase in
                guard case .streaming(let writer, let watchdog, _, _) = phase else { return nil }
                phase = .streamEnded
                return (writer, watchdog)
            }
            guard let (writer, watchdog) = ended else { return }
            watchdog.stop()
            if let error { writer.fail(error) } else { writer.finish() }
        }

        /// A response head came (and the call has not completed yet).
        var hasResponse: Bool {
            phase.withLock { phase in
                if case .receiving(_, .some, _, _) = phase { true } else { false }
            }
        }

        /// Fewer body bytes than an unencoded response's `Content-Length` announced.
        var isTruncated: Bool {
            phase.withLock { phase in
                guard case .receiving(_, _, let body, let declared?) = phase else { return false }
                return body.readableBytes < declared
            }
        }

        /// The `Content-Length` of a response whose body URLSession passes on as it came (no
        /// `Content-Encoding`: a decoded body's length is not the declared one).
        static func unencodedLength(_ response: HTTPURLResponse) -> Int? {
            guard response.value(forHTTPHeaderField: "Content-Encoding") == nil,
                  let value = response.value(forHTTPHeaderField: "Content-Length") else { return nil }
            return Int(value.trimmingCharacters(in: .whitespaces))
        }
    }
}
