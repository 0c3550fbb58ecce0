import AsyncHTTPClient
import NIOCore
import NIOHTTP1
import Synchronization

/// Collects one upstream response on its event loop: the head, then the body up to a limit.
///
/// The whole exchange stays on the connection's event loop (no async sequence demand hopping
/// between threads per body part); the gateway's task waits once, for the finished response.
final class NIOResponseCollector: HTTPClientResponseDelegate {
    typealias Response = (head: HTTPResponseHead, body: ByteBuffer)

    private struct State {
        var head: HTTPResponseHead?
        var body: ByteBuffer?
    }

    private let limit: Int
    // Only the task's event loop calls the delegate, one callback at a time; the lock is
    // uncontended and there so that `afterHead` can be read from the waiting task.
    private let state = Mutex(State())

    init(limit: Int) {
        self.limit = limit
    }

    /// Whether the response head arrived, so a failure is a reset mid-body rather than a failed connect.
    var afterHead: Bool { state.withLock { $0.head != nil } }

    func didReceiveHead(task: HTTPClient.Task<Response>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
        state.withLock { $0.head = head }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didReceiveBodyPart(task: HTTPClient.Task<Response>, _ part: ByteBuffer) -> EventLoopFuture<Void> {
        let overLimit = state.withLock { state -> Bool in
            let collected = state.body?.readableBytes ?? 0
            guard collected + part.readableBytes <= limit else { return true }
            if state.body == nil {
                state.body = part  // the common single-part body: no copy
            } else {
                state.body!.writeImmutableBuffer(part)
            }
            return false
        }
        if overLimit {
            return task.eventLoop.makeFailedFuture(NIOTooManyBytesError(maxBytes: limit))
        }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didFinishRequest(task: HTTPClient.Task<Response>) throws -> Response {
        try state.withLock { state in
            guard let head = state.head else { throw UpstreamError.protocolError("no response head") }
            return (head, state.body ?? ByteBuffer())
        }
    }
}
