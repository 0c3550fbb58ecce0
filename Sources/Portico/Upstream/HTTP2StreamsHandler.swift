import NIOCore
import NIOHPACK
import NIOHTTP1
import NIOHTTP2

/// The exchanges of one `HTTP2Connection`, driven frame by frame on the connection's own
/// channel: between NIOHTTP2's handler (in its frame mode, no stream channels) and
/// `HTTP2ConnectionHandler`. A request is a row in a table of open streams, not a child channel
/// with a pipeline and an HTTP/1 codec (perf, 2026-12-03: the stream channels were in 30 % of
/// HTTP/2's samples, the codec in 26 %; bench/http2 since: 1.02–1.13× HTTP/1.1's CPU, from 1.4×).
///
/// Each stream runs the HTTP/1.1 exchange's own machine (`HTTP1ExchangeStateMachine`: limits,
/// deadline, collecting or streaming the body, the failures' kinds), fed the response head
/// mapped here from HPACK, and its `HTTP2StreamFlow` decides the stream's WINDOW_UPDATEs: held
/// while the relay's reader is behind (that stream's window shuts, the others flow). The
/// connection's window is reopened here too (NIOHTTP2 leaves both to whoever reads frames).
/// A stream ended early is reset with `RST_STREAM(CANCEL)`; the connection carries on.
///
/// Every method runs on the channel's event loop.
final class HTTP2StreamsHandler: ChannelInboundHandler {
    typealias InboundIn = HTTP2Frame
    typealias InboundOut = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    typealias Machine = HTTP1ExchangeStateMachine<HTTP1ExchangeHandler.Waiter, HTTP1ExchangeHandler.StreamedBody>

    /// One open stream: its exchange's machine, its window, its deadline.
    final class Stream: NIOScheduledCallbackHandler {
        let id: HTTP2StreamID
        let requestIsHead: Bool
        var machine: Machine
        var flow: HTTP2StreamFlow
        var timer: NIOScheduledCallback?
        /// Gives the stream's room back to the pool: once, when the stream leaves the table.
        let onClose: () -> Void
        weak var handler: HTTP2StreamsHandler?

        init(id: HTTP2StreamID, requestIsHead: Bool, machine: Machine, onClose: @escaping () -> Void, handler: HTTP2StreamsHandler) {
            self.id = id
            self.requestIsHead = requestIsHead
            self.machine = machine
            flow = HTTP2StreamFlow(target: HTTP2Connection.streamWindow)
            self.onClose = onClose
            self.handler = handler
        }

        func handleScheduledCallback(eventLoop: some EventLoop) {
            timer = nil
            handler?.timerFired(self)
        }
    }

    private var streams: [HTTP2StreamID: Stream] = [:]
    /// Ours are odd and increasing (RFC 9113 §5.1.1).
    private var nextStreamID: Int32 = 1
    private var context: ChannelHandlerContext?
    private let scheme: String
    /// Streams ended this turn whose `onClose` has yet to run (`closeLater`).
    private var pendingCloses: [Stream] = []

    init(isTLS: Bool) {
        scheme = isTLS ? "https" : "http"
    }

    var openStreams: Int { streams.count }

    // MARK: Opening a stream

    /// Sends `exchange` on a new stream; `complete` hears its response or failure, once, and
    /// `onClose` when the stream has ended (also when it never opened). `box` is given the
    /// stream (for the caller's cancel and a streamed body's writes). `true`: the request went out.
    func open(_ exchange: HTTP1Exchange, box: NIOLoopBoundBox<Stream?>, onClose: @escaping () -> Void,
              complete: @escaping HTTP1ExchangeHandler.Completion) -> Bool {
        guard let context, context.channel.isActive, nextStreamID < Int32.max - 1 else {
            onClose()
            complete(.failure(HTTP2StreamRefused(failure: .connectionClosed("the HTTP/2 connection closed"))))
            return false
        }
        let id = HTTP2StreamID(nextStreamID)
        nextStreamID += 2
        let head = exchange.head
        var machine = Machine(awaitsHandshake: false)
        _ = machine.channelActive()
        let waiter = HTTP1ExchangeHandler.Waiter(complete: complete, makeRelay: exchange.makeRelay)
        let start = machine.execute(Machine.Exchange(waiter: waiter, limit: exchange.limit, requestIsHead: exchange.requestIsHead,
                                                     asksClose: !head.isKeepAlive || exchange.upload != nil || exchange.upgrade,
                                                     upgrade: exchange.upgrade),
                                    deadline: exchange.deadline, channelIsActive: true)
        guard case .send(let deadline) = start else {
            // Not reached: a new machine takes its first exchange.
            onClose()
            complete(.failure(UpstreamError.connectionClosed("the HTTP/2 stream could not start")))
            return false
        }
        let stream = Stream(id: id, requestIsHead: exchange.requestIsHead, machine: machine, onClose: onClose, handler: self)
        streams[id] = stream
        box.value = stream
        if let deadline {
            do {
                stream.timer = try context.eventLoop.assumeIsolated().scheduleCallback(at: deadline, handler: stream)
            } catch {
                fail(stream, error)  // the loop is shutting down
                return false
            }
        }
        let headers = Self.requestHeaders(head, scheme: scheme)
        // The last frame's promise: a stream NIOHTTP2 refuses (after GOAWAY, no id left) fails it.
        let written = context.eventLoop.makePromise(of: Void.self)
        written.futureResult.assumeIsolated().whenFailure { [self] error in fail(stream, error) }
        if exchange.upload != nil {
            context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: id, payload: .headers(.init(headers: headers)))),
                                  promise: written)
            return true
        }
        if let body = exchange.body, body.readableBytes > 0 {
            context.write(wrapOutboundOut(HTTP2Frame(streamID: id, payload: .headers(.init(headers: headers)))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: id, payload: .data(.init(data: .byteBuffer(body), endStream: true)))),
                                  promise: written)
        } else {
            context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: id, payload: .headers(.init(headers: headers, endStream: true)))),
                                  promise: written)
        }
        stream.flow.endSent()
        return true
    }

    /// A part of a streamed request body (`nil`: its end), written once the stream's window
    /// takes it: the returned future completes then, which is the upload's backpressure
    /// (NIOHTTP2 holds DATA beyond the window with its promise). `nil`: the stream has ended.
    func write(_ part: ByteBuffer?, on stream: Stream) -> EventLoopFuture<Void>? {
        guard let context, streams[stream.id] === stream, !stream.flow.sentEnd else { return nil }
        let promise = context.eventLoop.makePromise(of: Void.self)
        let data = HTTP2Frame.FramePayload.Data(data: .byteBuffer(part ?? ByteBuffer()), endStream: part == nil)
        context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: stream.id, payload: .data(data))), promise: promise)
        if part == nil {
            stream.flow.endSent()
            if stream.flow.isClosed { remove(stream) }
        }
        return promise.futureResult
    }

    /// The caller went away (its task cancelled, its relay's reader gone): the stream is reset.
    func cancel(_ stream: Stream) {
        guard streams[stream.id] === stream else { return }
        perform(stream.machine.failed(CancellationError()), on: stream)
    }

    // MARK: Frames and events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        endAll { $0.handlerRemoved() }
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        // NIOHTTP2 closes its streams with the connection: each machine hears what a stream
        // channel's did (the connection closed under it).
        endAll { $0.channelInactive() }
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        if frame.streamID != .rootStream, let stream = streams[frame.streamID] {
            switch frame.payload {
            case .headers(let headers):
                received(headers, on: stream, context: context)
            case .data(let data):
                if case .byteBuffer(let buffer) = data.data, buffer.readableBytes > 0 {
                    perform(stream.machine.receivedBody(buffer), on: stream)
                }
                if data.endStream { receivedEnd(on: stream, context: context) }
            default:
                // RST_STREAM arrives as NIOHTTP2's StreamClosedEvent (as do GOAWAY's refusals).
                break
            }
        }
        // The connection's own frames are `HTTP2ConnectionHandler`'s (it hears of the others'
        // arrival at `channelReadComplete`, for its keepalive).
        if frame.streamID == .rootStream { context.fireChannelRead(data) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // NIOHTTP2's stream events are this handler's alone (several a request: not passed on
        // to be cast again); anything else (TLS's) goes on.
        switch event {
        case let window as NIOHTTP2WindowUpdatedEvent:
            windowChanged(window, context: context)
        case let closed as StreamClosedEvent:
            if let stream = streams[closed.streamID] {
                // Out of the table first: NIOHTTP2 has closed it, nothing more is to be sent on it.
                remove(stream)
                if let reason = closed.reason {
                    perform(stream.machine.errorCaught(NIOHTTP2Errors.streamClosed(streamID: closed.streamID, errorCode: reason),
                                                       uncleanShutdown: false), on: stream)
                } else {
                    perform(stream.machine.channelInactive(), on: stream)
                }
            }
        case is NIOHTTP2StreamCreatedEvent, is NIOHTTP2BulkStreamWindowChangeEvent:
            // A stream's initial window moved (our SETTINGS acknowledged): the next DATA's
            // `NIOHTTP2WindowUpdatedEvent` reports the window as it now is.
            break
        default:
            context.fireUserInboundEventTriggered(event)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A write on a stream NIOHTTP2 refused is that stream's (a stream channel's, before):
        // the connection is not told.
        if let streamError = error as? NIOHTTP2Errors.StreamError {
            if let stream = streams[streamError.streamID] { fail(stream, streamError.baseError) }
            return
        }
        context.fireErrorCaught(error)
    }

    // MARK: Parts

    private func received(_ headers: HTTP2Frame.FramePayload.Headers, on stream: Stream, context: ChannelHandlerContext) {
        guard !stream.flow.headReceived else {
            // Trailers: dropped, the body ends (a HEADERS frame mid-body without END_STREAM is
            // malformed, and NIOHTTP2's validation resets the stream first).
            if headers.endStream { receivedEnd(on: stream, context: context) }
            return
        }
        guard let status = headers.headers.first(name: ":status").flatMap({ Int($0) }) else {
            fail(stream, UpstreamError.protocolError("HTTP/2: a response without a valid :status"))
            return
        }
        // 1xx are interim (no 101 on HTTP/2): the final head follows.
        if (100..<200).contains(status), !headers.endStream { return }
        stream.flow.headReceived = true
        let head = Self.responseHead(status: status, headers.headers, requestIsHead: stream.requestIsHead,
                                     endStream: headers.endStream)
        let eventLoop = context.eventLoop
        perform(stream.machine.receivedHead(head) { waiter, length in
            guard let makeRelay = waiter.makeRelay else { return nil }
            let cancel = NIOLoopBound((self, stream), eventLoop: eventLoop)
            return HTTP1ExchangeHandler.StreamedBody(
                relay: makeRelay(length) { cancel.eventLoop.execute { cancel.value.0.cancel(cancel.value.1) } },
                finished: eventLoop.makePromise(of: Bool.self))
        }, on: stream)
        if headers.endStream { receivedEnd(on: stream, context: context) }
    }

    private func receivedEnd(on stream: Stream, context: ChannelHandlerContext) {
        stream.flow.endReceived()
        let action = stream.machine.receivedEnd(channelIsActive: context.channel.isActive)
        if stream.flow.isClosed { remove(stream) }
        perform(action, on: stream)
    }

    private func windowChanged(_ event: NIOHTTP2WindowUpdatedEvent, context: ChannelHandlerContext) {
        guard let size = event.inboundWindowSize else { return }
        if event.streamID == .rootStream {
            // Reopened whole once half is used: room for several streams at full speed.
            let target = HTTP2Connection.connectionWindow
            if size <= target / 2 { sendWindowUpdate(target - size, on: .rootStream, context: context) }
        } else if let stream = streams[event.streamID], let increment = stream.flow.windowChanged(to: size) {
            sendWindowUpdate(increment, on: stream.id, context: context)
        }
    }

    private func sendWindowUpdate(_ increment: Int, on id: HTTP2StreamID, context: ChannelHandlerContext) {
        context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: id, payload: .windowUpdate(windowSizeIncrement: increment))),
                              promise: nil)
    }

    /// The relay's reader took its queue down: the stream's window reopens.
    private func readerCaughtUp(_ stream: Stream) {
        guard streams[stream.id] === stream else { return }
        perform(stream.machine.readerCaughtUp(), on: stream)
        if let increment = stream.flow.resume(), let context {
            sendWindowUpdate(increment, on: stream.id, context: context)
        }
    }

    fileprivate func timerFired(_ stream: Stream) {
        perform(stream.machine.timerFired(), on: stream)
    }

    private func fail(_ stream: Stream, _ error: any Error) {
        perform(stream.machine.failed(error), on: stream)
    }

    /// Ends every stream with what `event` makes of it (the connection's end), none reset.
    private func endAll(_ event: (inout Machine) -> Machine.Action) {
        let all = streams
        streams.removeAll()
        for stream in all.values {
            stream.timer?.cancel()
            stream.timer = nil
            closeLater(stream)
            perform(event(&stream.machine), on: stream)
        }
    }

    /// Takes the stream out of the table and gives its room back; once.
    private func remove(_ stream: Stream) {
        guard streams[stream.id] === stream else { return }
        streams[stream.id] = nil
        stream.timer?.cancel()
        stream.timer = nil
        closeLater(stream)
    }

    /// The pool hears of the stream's end on the next turn, as it heard of a stream channel's
    /// close: what it does then (closing a drained connection) must not run inside NIOHTTP2's
    /// read. The ends of one turn go together, in one task.
    private func closeLater(_ stream: Stream) {
        guard let eventLoop = context?.eventLoop else {
            stream.onClose()
            return
        }
        pendingCloses.append(stream)
        guard pendingCloses.count == 1 else { return }
        eventLoop.assumeIsolated().execute { [self] in
            let ended = pendingCloses
            pendingCloses.removeAll(keepingCapacity: true)
            for stream in ended { stream.onClose() }
        }
    }

    /// Ends the stream before both its sides have: `RST_STREAM(CANCEL)` (a stream channel's
    /// close, before), the connection's other streams untouched.
    private func reset(_ stream: Stream) {
        guard streams[stream.id] === stream else { return }
        let open = !stream.flow.isClosed
        remove(stream)
        if open, let context, context.channel.isActive {
            context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: stream.id, payload: .rstStream(.cancel))), promise: nil)
        }
    }

    private func stopTimer(_ stream: Stream) {
        stream.timer?.cancel()
        stream.timer = nil
    }

    /// Does what the stream's machine said, as `HTTP1ExchangeHandler` does for a connection;
    /// closing the connection there is resetting the stream here.
    private func perform(_ action: consuming Machine.Action, on stream: Stream) {
        switch consume action {
        case .none, .read, .ready:
            break
        case .close:
            reset(stream)
        case .stopTimer:
            stopTimer(stream)
        case .streamResponse(let waiter, let head, let body):
            stopTimer(stream)
            waiter.complete(.success(HTTP1Response(head: head, body: ByteBuffer(), stream: body.relay.stream, reusable: false,
                                                   finished: body.finished.futureResult)))
        case .deliver(let body, let part):
            deliver(part, to: body.relay, on: stream)
        case .respond(let waiter, let head, let body, let reusable):
            stopTimer(stream)
            if !reusable { reset(stream) }
            waiter.complete(.success(HTTP1Response(head: head, body: body, reusable: reusable)))
        case .finishStream(let body, let reusable, _):
            stopTimer(stream)
            if !reusable { reset(stream) }
            body.relay.finish()
            body.finished.succeed(reusable)
        case .switchProtocols(let waiter, _):
            // Not reached: no 101 on HTTP/2 (an interim head is skipped), and upgrades go on HTTP/1.1.
            stopTimer(stream)
            reset(stream)
            waiter.complete(.failure(UpstreamError.protocolError("101 Switching Protocols on HTTP/2")))
        case .fail(let failure):
            stopTimer(stream)
            reset(stream)
            switch failure {
            case .ready, .connection:
                break
            case .waiter(let waiter, let error):
                waiter.complete(.failure(error))
            case .relay(let body, let error):
                body.relay.fail(error)
                body.finished.succeed(false)
            }
        }
    }

    private func deliver(_ part: ByteBuffer, to relay: StreamedResponseRelay, on stream: Stream) {
        guard let eventLoop = context?.eventLoop else { return }
        let resume = NIOLoopBound((self, stream), eventLoop: eventLoop)
        switch relay.deliver(part, resume: { resume.eventLoop.execute { resume.value.0.readerCaughtUp(resume.value.1) } }) {
        case .proceed:
            break
        case .pause:
            stream.machine.readerBehind()
            stream.flow.pause()
        case .stop:
            perform(stream.machine.failed(CancellationError()), on: stream)
        }
    }
}
