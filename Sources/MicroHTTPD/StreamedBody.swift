import CMicroHTTPD
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// Bodies that flow while they are sent, in both directions. The application supplies the
// other end: a source the server pulls a response body from, a sink it pushes an upload into.
// Neither side ever blocks libmicrohttpd's thread: with nothing to send, or a sink that is
// full, the connection is suspended until the application wakes it.

/// Where a streamed response body comes from.
public protocol ResponseBodySource: AnyObject, Sendable {
    /// On the connection's thread: copies ready bytes into `buffer`. With none ready, returns
    /// `.pending` and calls `wake` (any thread, once) when there are, or the body ended or failed.
    func read(into buffer: UnsafeMutableRawBufferPointer, wake: @escaping @Sendable () -> Void) -> ResponseBodyRead
    /// The exchange is over, exactly once: `delivered` when the body was read to its end and
    /// the response sent whole; otherwise the client left or the connection failed.
    func close(delivered: Bool)
}

public enum ResponseBodyRead: Sendable, Equatable {
    case bytes(Int)
    case pending
    /// The body is complete: the terminating chunk is sent.
    case end
    /// The body cannot be completed: the connection is closed short of its framing, so no
    /// client can take what it got for the whole body.
    case failed
}

/// Where a streamed request body goes.
public protocol RequestBodySink: AnyObject, Sendable {
    /// On the connection's thread: takes (copies) `bytes`. `.full` means they were taken but
    /// the server must stop reading until `resume` is called (any thread, once).
    func write(_ bytes: UnsafeRawBufferPointer, resume: @escaping @Sendable () -> Void) -> RequestBodyWrite
    /// The body arrived whole.
    func finish()
    /// The body will not arrive whole.
    func fail(_ reason: UploadFailure)
}

public enum RequestBodyWrite: Sendable, Equatable {
    case accepted
    case full
    /// Nobody reads the body any more (the handler answered or gave up): the rest is discarded.
    case closed
}

/// Why an upload stopped short.
public enum UploadFailure: Sendable, Equatable {
    /// The client closed or reset the connection mid-body.
    case clientGone
    /// The body grew past `maxBodyBytes`.
    case tooLarge(limit: Int)
    /// The client went silent for longer than `requestTimeout`.
    case timeout
    /// The server is stopping.
    case shuttingDown
}

/// A streamed response on its connection: libmicrohttpd's content reader pulls from the source,
/// suspending the connection when nothing is ready. Lives from the response's queueing until
/// the request completes; the server keeps it (for its client leaving, and for `stop`).
final class StreamingResponse: Sendable {
    let source: any ResponseBodySource
    let suspension: Suspension
    let timer: ConnectionTimer
    private let wake: @Sendable () -> Void
    private struct State {
        var ended = false
        var aborted = false
        var closed = false
        var sent: UInt64 = 0
    }
    private let state = Mutex(State())
    /// The declared length: libmicrohttpd asks no more once it is sent, so reaching it is the end.
    private let length: UInt64?

    init(source: any ResponseBodySource, length: UInt64?, suspension: Suspension, timer: ConnectionTimer) {
        self.source = source
        self.length = length
        self.suspension = suspension
        self.timer = timer
        self.wake = { [suspension] in suspension.resume() }
    }

    /// libmicrohttpd's content reader: bytes, 0 after suspending (nothing ready), or the end markers.
    func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
        if state.withLock({ $0.aborted }) { return portico_reader_error }
        switch source.read(into: buffer, wake: wake) {
        case .bytes(let count):
            state.withLock { state in
                state.sent += UInt64(count)
                if let length, state.sent >= length { state.ended = true }
            }
            return count
        case .pending:
            // Resumed by `wake`; if it came already, libmicrohttpd calls again at once.
            suspension.suspend()
            return 0
        case .end:
            state.withLock { $0.ended = true }
            return portico_reader_end
        case .failed:
            return portico_reader_error
        }
    }

    /// Ends the stream from the server's side (its client left, the server is stopping): the
    /// next read fails, so libmicrohttpd closes the connection short of the framing.
    func abort() {
        let first = state.withLock { state -> Bool in
            state.aborted = true
            guard !state.closed else { return false }
            state.closed = true
            return true
        }
        if first { source.close(delivered: false) }
        suspension.resume()
    }

    /// The request completed (`ok`: libmicrohttpd sent it all) or the connection closed.
    func finished(ok: Bool) {
        let delivered = state.withLock { state -> Bool? in
            guard !state.closed else { return nil }
            state.closed = true
            return ok && state.ended && !state.aborted
        }
        guard let delivered else { return }
        source.close(delivered: delivered)
    }
}

extension StreamingResponse: HangUpListener {
    /// libmicrohttpd does not poll a connection suspended for want of a chunk: its client
    /// leaving is noticed here, the source told at once (its upstream cancelled), the socket shut down.
    func clientLeft(timer: ConnectionTimer) -> Bool {
        let going = state.withLock { !$0.closed }
        timer.shutDown()
        abort()
        return going
    }

    var isOver: Bool { state.withLock { $0.closed } }
}

/// The C content reader: `cls` is the `StreamingResponse`, retained by the response.
let streamingReader: MHD_ContentReaderCallback = { cls, _, buffer, max in
    guard let cls, let buffer else { return portico_reader_error }
    let streaming = Unmanaged<StreamingResponse>.fromOpaque(cls).takeUnretainedValue()
    return streaming.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: max))
}

/// Releases the response's hold on its `StreamingResponse`.
let streamingRelease: MHD_ContentReaderFreeCallback = { cls in
    guard let cls else { return }
    let streaming = Unmanaged<StreamingResponse>.fromOpaque(cls).takeRetainedValue()
    streaming.finished(ok: false)
}
