import NIOCore
import NIOHTTP1
import NIOSSL
import NIOTLS

/// The last handler of an `HTTP1Connection`'s pipeline: says when the connection is ready
/// (TCP up, and with TLS the handshake done and `PeerCertificateCheckHandler` satisfied), then
/// runs one exchange at a time: writes the request (a streamed request body follows from
/// `HTTP1Connection`), collects the response head, then the body up to a limit — or, for a
/// large or undeclared body (`ResponseBodyPlan`), answers at the head with a streamed body and
/// relays the parts as they come, pausing reads while the reader is behind — and reports
/// whether the connection may carry another request.
///
/// What happens when is `HTTP1ExchangeStateMachine`'s: this handler turns NIO's events into the
/// machine's and its actions into the channel's operations, and keeps only what those need (the
/// context, the `ready` promise, the one timer the machine asks for).
///
/// Every method runs on the channel's event loop. Failures reach the waiting promise as
/// `UpstreamError` (via `NIOUpstream.classify`) where a kind applies.
final class HTTP1ExchangeHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart

    /// Who hears an exchange's response (or its failure): exactly once.
    typealias Completion = (Result<HTTP1Response, any Error>) -> Void

    /// Who waits for an exchange's response, and how its body may stream (`nil`: collected whole).
    struct Waiter {
        let complete: Completion
        let makeRelay: HTTP1Exchange.RelayFactory?
    }

    /// A streamed response body on its way: where its parts go, and what hears how it ended
    /// (`true`: the connection may be reused).
    struct StreamedBody {
        let relay: StreamedResponseRelay
        let finished: EventLoopPromise<Bool>
    }

    typealias Machine = HTTP1ExchangeStateMachine<Waiter, StreamedBody>

    private var machine: Machine
    private let readyPromise: EventLoopPromise<Void>
    /// Succeeds once the connection can carry a request.
    let ready: EventLoopFuture<Void>
    private var context: ChannelHandlerContext?
    /// The timer the machine asked for: the handshake's limit, then an exchange's deadline (a
    /// callback, not `scheduleTask`: no promise and future made, and dropped, per request).
    private var timer: NIOScheduledCallback?
    /// Whether the server has closed the connection unread by the loop (`PeerLiveness.hasClosed`
    /// on a socket); `nil`: never asked.
    private let peerHasClosed: ((any Channel) -> Bool)?

    /// `ready` succeeds once the connection can carry a request; with `awaitsHandshake` that
    /// is after `TLSUserEvent.handshakeCompleted`, otherwise when the channel is active.
    /// `peerHasClosed` is asked on a reused connection before a request that could not be sent
    /// again once written (`HTTP1Exchange.resendableAfterWrite`).
    init(ready: EventLoopPromise<Void>, awaitsHandshake: Bool, peerHasClosed: ((any Channel) -> Bool)? = nil) {
        machine = Machine(awaitsHandshake: awaitsHandshake)
        readyPromise = ready
        self.ready = ready.futureResult
        self.peerHasClosed = peerHasClosed
    }

    /// Fails `ready` with `failure` (and closes) if the handshake is not done within `timeout`:
    /// the TCP connect timeout alone does not cover TLS.
    func limitHandshake(to timeout: TimeAmount, on eventLoop: any EventLoop, failure: UpstreamError) {
        guard machine.limitHandshake(failure: failure) else { return }
        // A loop that is shutting down runs no timers (nor this connection): nothing to limit.
        timer = try? eventLoop.assumeIsolated().scheduleCallback(in: timeout, handler: self)
    }

    /// Sends one request; `complete` gets the response (or the failure), once. With a streamed
    /// request body only the head is written here: the caller writes the body parts and the
    /// end, and the connection is not reused afterwards (the response may end before the upload).
    /// `true`: the request went out (else `complete` has heard why not, and a streamed body is
    /// untouched).
    @discardableResult
    func execute(_ request: HTTP1Exchange, complete: @escaping Completion) -> Bool {
        let head = request.head
        let exchange = Machine.Exchange(waiter: Waiter(complete: complete, makeRelay: request.makeRelay), limit: request.limit,
                                        requestIsHead: request.requestIsHead,
                                        asksClose: !head.isKeepAlive || request.upload != nil || request.upgrade,
                                        upgrade: request.upgrade)
        let context = self.context
        let isActive = context?.channel.isActive ?? false
        // Only where the answer matters: a request that may go out twice is sent again anyway
        // if the connection turns out to have closed under it.
        var peerClosed = false
        if isActive, machine.isReused, !request.resendableAfterWrite, let peerHasClosed, let channel = context?.channel {
            peerClosed = peerHasClosed(channel)
        }
        switch machine.execute(exchange, deadline: request.deadline, channelIsActive: isActive, peerHasClosed: peerClosed) {
        case .refuse(let waiter, let error):
            waiter.complete(.failure(error))
            return false
        case .send(let deadline):
            guard let context else {
                // Not reached: without a context the channel counts as inactive and the request is refused.
                perform(machine.failed(UpstreamError.connectionClosed("pooled connection no longer usable")))
                return false
            }
            if let deadline {
                do {
                    timer = try context.eventLoop.assumeIsolated().scheduleCallback(at: deadline, handler: self)
                } catch {
                    perform(machine.failed(error))  // the loop is shutting down
                    return false
                }
            }
            guard request.upload == nil else {
                context.writeAndFlush(wrapOutboundOut(.head(head)), promise: nil)
                return true
            }
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            if let body = request.body, body.readableBytes > 0 {
                context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            }
            let written = context.eventLoop.makePromise(of: Void.self)
            written.futureResult.assumeIsolated().whenFailure { [self] error in perform(machine.failed(error)) }
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: written)
            return true
        }
    }

    // MARK: NIO's events, as the machine's

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if context.channel.isActive { perform(machine.channelActive()) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        perform(machine.handlerRemoved())
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        perform(machine.channelActive())
        context.fireChannelActive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent {
            perform(machine.handshakeCompleted())
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            let channel = context.channel
            perform(machine.receivedHead(head) { waiter, length in
                guard let makeRelay = waiter.makeRelay else { return nil }
                return StreamedBody(relay: makeRelay(length) { channel.close(promise: nil) },
                                    finished: channel.eventLoop.makePromise(of: Bool.self))
            })
        case .body(let part):
            perform(machine.receivedBody(part))
        case .end:
            perform(machine.receivedEnd(channelIsActive: context.channel.isActive))
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        let uncleanShutdown = if let tlsError = error as? NIOSSLError, case .uncleanShutdown = tlsError { true } else { false }
        perform(machine.errorCaught(error, uncleanShutdown: uncleanShutdown))
    }

    func channelInactive(context: ChannelHandlerContext) {
        perform(machine.channelInactive())
        context.fireChannelInactive()
    }

    func read(context: ChannelHandlerContext) {
        if machine.read() { context.read() }
    }

    // MARK: The machine's actions, on the channel

    private func perform(_ action: consuming Machine.Action) {
        // Consumed: what the action carries moves into the calls below, not copied.
        switch consume action {
        case .none:
            break
        case .read:
            context?.read()
        case .close:
            context?.close(promise: nil)
        case .ready:
            stopTimer()
            readyPromise.succeed()
        case .stopTimer:
            stopTimer()
        case .streamResponse(let waiter, let head, let body):
            stopTimer()
            waiter.complete(.success(HTTP1Response(head: head, body: ByteBuffer(), stream: body.relay.stream, reusable: false,
                                                   finished: body.finished.futureResult)))
        case .deliver(let body, let part):
            deliver(part, to: body.relay)
        case .respond(let waiter, let head, let body, let reusable):
            stopTimer()
            if !reusable { context?.close(promise: nil) }
            waiter.complete(.success(HTTP1Response(head: head, body: body, reusable: reusable)))
        case .finishStream(let body, let reusable, let read):
            stopTimer()
            if !reusable { context?.close(promise: nil) }
            if read { context?.read() }
            body.relay.finish()
            body.finished.succeed(reusable)
        case .switchProtocols(let waiter, let head):
            stopTimer()
            switchProtocols(head, waiter: waiter)
        case .fail(let failure):
            stopTimer()
            switch failure {
            case .ready(let error):
                readyPromise.fail(error)
            case .waiter(let waiter, let error):
                waiter.complete(.failure(error))
            case .relay(let body, let error):
                // The response was handed on at its head: its reader hears of the failure.
                body.relay.fail(error)
                body.finished.succeed(false)
            case .connection:
                break
            }
            context?.close(promise: nil)
        }
    }

    private func deliver(_ part: ByteBuffer, to relay: StreamedResponseRelay) {
        guard let eventLoop = context?.eventLoop else { return }
        let handler = NIOLoopBound(self, eventLoop: eventLoop)
        switch relay.deliver(part, resume: { handler.eventLoop.execute { handler.value.readerCaughtUp() } }) {
        case .proceed: break
        case .pause: machine.readerBehind()
        case .stop: perform(machine.failed(CancellationError()))
        }
    }

    private func readerCaughtUp() {
        perform(machine.readerCaughtUp())
    }

    private func stopTimer() {
        timer?.cancel()
        timer = nil
    }

    /// A 101 answered an upgrade request: the HTTP codecs and this handler leave the pipeline
    /// and a `RelayHandler` takes the connection's bytes (what the decoder had read past the head
    /// is forwarded to it as it is removed); the exchange completes with the tunnel.
    private func switchProtocols(_ head: HTTPResponseHead, waiter: Waiter) {
        guard let context else {
            // Not reached: a response's end is read in the pipeline, so with a context.
            waiter.complete(.failure(UpstreamError.connectionClosed("the connection closed as it switched protocols")))
            return
        }
        let channel = context.channel
        let relay = RelayHandler(side: .upstream)
        // On the next turn: this runs inside the decoder's own read, which must not be removed under it.
        context.eventLoop.assumeIsolated().execute {
            do {
                let pipeline = channel.pipeline.syncOperations
                try pipeline.addHandler(relay)
                let own = try pipeline.context(handler: self)
                pipeline.removeHandler(context: own, promise: nil)
                let decoder = try pipeline.context(handlerType: ByteToMessageHandler<HTTPResponseDecoder>.self)
                pipeline.removeHandler(context: decoder, promise: nil)
                let encoder = try pipeline.context(handlerType: HTTPRequestEncoder.self)
                pipeline.removeHandler(context: encoder, promise: nil)
            } catch {
                channel.close(promise: nil)
                waiter.complete(.failure(UpstreamError.connectionClosed("the connection closed as it switched protocols")))
                return
            }
            waiter.complete(.success(HTTP1Response(head: head, body: ByteBuffer(), reusable: false,
                                                   tunnel: UpstreamTunnel(channel: channel, relay: relay))))
        }
    }

    /// The `UpstreamError` for `error` (`NIOUpstream.classify`); cancellation as is.
    static func kind(of error: any Error, afterHead: Bool, limit: Int) -> any Error {
        Machine.kind(of: error, afterHead: afterHead, limit: limit)
    }
}

extension HTTP1ExchangeHandler: NIOScheduledCallbackHandler {
    /// The timer the machine asked for has fired.
    func handleScheduledCallback(eventLoop: some EventLoop) {
        timer = nil
        perform(machine.timerFired())
    }
}

/// One request for an `HTTP1ConnectionPool`, and how its response body is to travel.
struct HTTP1Exchange: Sendable {
    var head: HTTPRequestHead
    /// A buffered request body (`nil`: none, or streamed).
    var body: ByteBuffer?
    /// A streamed request body, written after the head as it arrives.
    var upload: UpstreamUpload?
    /// `max_response_bytes`.
    var limit: Int
    /// When the response must be here (its head when it streams, all of it otherwise), on the
    /// connection's loop; `nil`: the caller bounds it.
    var deadline: NIODeadline? = nil
    var requestIsHead: Bool
    /// The request asks to switch protocols (`GatewayRequest.upgrade`): a 101 hands the
    /// connection over (`HTTP1Response.tunnel`); without it a 101 is a protocol error.
    var upgrade = false
    /// The relay for a response body that streams, given its declared length and how to
    /// cancel the exchange (close the connection); `nil`: every body is collected whole.
    var makeRelay: RelayFactory?

    typealias RelayFactory = @Sendable (_ length: Int?, _ cancel: @escaping @Sendable () -> Void) -> StreamedResponseRelay
}

/// One upstream response: collected whole, or with a streamed body still flowing.
struct HTTP1Response: Sendable {
    var head: HTTPResponseHead
    /// The body collected whole (empty when it streams).
    var body: ByteBuffer
    /// The body when it streams.
    var stream: BodyStream? = nil
    /// The connection may carry another request (keep-alive on both sides, still open).
    /// For a streamed body, `finished` says it once the body has ended.
    var reusable: Bool
    /// A streamed body's end: `true` when the connection may carry another request.
    var finished: EventLoopFuture<Bool>? = nil
    /// After a 101 to an upgrade request: the connection, out of the pool for good.
    var tunnel: UpstreamTunnel? = nil
}
