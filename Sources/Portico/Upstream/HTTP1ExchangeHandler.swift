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
/// Every method runs on the channel's event loop. Failures reach the waiting promise as
/// `UpstreamError` (via `NIOUpstream.classify`) where a kind applies.
final class HTTP1ExchangeHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart

    /// Who hears an exchange's response (or its failure): exactly once.
    typealias Completion = (Result<HTTP1Response, any Error>) -> Void

    /// The exchange in progress: only what its response needs (the request itself is written
    /// by then). A class, carried by `State.exchanging` and changed in place: a struct payload
    /// would be copied out of the enum and back per response part, retaining each of its
    /// references every time (measured in session 13); this costs one allocation per exchange.
    private final class ResponseInProgress {
        /// `nil` once called (a streamed response's head has been handed on).
        var complete: Completion?
        let limit: Int
        let requestIsHead: Bool
        let makeRelay: HTTP1Exchange.RelayFactory?
        let requestAsksClose: Bool
        /// The request asked to switch protocols: a 101 ends the exchange with a tunnel.
        let upgrade: Bool
        var head: HTTPResponseHead?
        var body: ByteBuffer?
        /// Once the response streams: where its parts go, and what hears how it ended
        /// (`true`: the connection may be reused).
        var relay: StreamedResponseRelay?
        var finished: EventLoopPromise<Bool>?

        init(complete: @escaping Completion, limit: Int, requestIsHead: Bool,
             makeRelay: HTTP1Exchange.RelayFactory?, requestAsksClose: Bool, upgrade: Bool) {
            self.upgrade = upgrade
            self.complete = complete
            self.limit = limit
            self.requestIsHead = requestIsHead
            self.makeRelay = makeRelay
            self.requestAsksClose = requestAsksClose
        }
    }

    private enum State {
        /// Waiting for TCP (and the TLS handshake, when `awaitsHandshake`).
        case connecting(EventLoopPromise<Void>)
        case idle
        case exchanging(ResponseInProgress)
        /// Switched protocols (a 101 to an upgrade request): this handler is on its way out of
        /// the pipeline, and the connection out of its pool (`UpstreamTunnel`).
        case upgraded
        case closed
    }

    private var state: State
    /// Succeeds once the connection can carry a request.
    let ready: EventLoopFuture<Void>
    private let awaitsHandshake: Bool
    private var context: ChannelHandlerContext?
    private var handshakeTimeout: Scheduled<Void>?
    /// The exchange's deadline (`HTTP1Exchange.deadline`): until the head of a streamed
    /// response, or the end of a buffered one.
    private var exchangeTimeout: NIOScheduledCallback?
    /// A streamed response's reader is a high water behind: reads wait (held here, so TLS and
    /// the decoder see them in order when they go on).
    private var readsPaused = false
    /// The error that closed the connection while no exchange ran (a TLS alert, say).
    private var closedBy: (any Error)?
    private var readHeld = false

    /// `ready` succeeds once the connection can carry a request; with `awaitsHandshake` that
    /// is after `TLSUserEvent.handshakeCompleted`, otherwise when the channel is active.
    init(ready: EventLoopPromise<Void>, awaitsHandshake: Bool) {
        self.state = .connecting(ready)
        self.ready = ready.futureResult
        self.awaitsHandshake = awaitsHandshake
    }

    /// Fails `ready` with `failure` (and closes) if the handshake is not done within `timeout`:
    /// the TCP connect timeout alone does not cover TLS.
    func limitHandshake(to timeout: TimeAmount, on eventLoop: any EventLoop, failure: UpstreamError) {
        guard case .connecting = state else { return }
        handshakeTimeout = eventLoop.assumeIsolated().scheduleTask(in: timeout) { [self] in
            fail(failure)
        }
    }

    /// Sends one request; `complete` gets the response (or the failure), once. With a streamed
    /// request body only the head is written here: the caller writes the body parts and the
    /// end, and the connection is not reused afterwards (the response may end before the upload).
    func execute(_ request: HTTP1Exchange, complete: @escaping Completion) {
        guard case .idle = state, let context, context.channel.isActive else {
            // A TLS 1.3 server refuses a client certificate after the handshake: its alert can
            // close a new connection before the first request; that reason is the answer.
            complete(.failure(closedBy.map { Self.kind(of: $0, afterHead: false, limit: 0) }
                              ?? UpstreamError.connectionClosed("pooled connection no longer usable")))
            return
        }
        let head = request.head
        state = .exchanging(ResponseInProgress(complete: complete, limit: request.limit, requestIsHead: request.requestIsHead,
                                     makeRelay: request.makeRelay,
                                     requestAsksClose: !head.isKeepAlive || request.upload != nil || request.upgrade,
                                     upgrade: request.upgrade))
        if let deadline = request.deadline {
            // A callback, not `scheduleTask`: no promise and future made (and dropped) per request.
            do {
                exchangeTimeout = try context.eventLoop.assumeIsolated().scheduleCallback(at: deadline, handler: self)
            } catch {
                fail(error)  // the loop is shutting down
                return
            }
        }
        guard request.upload == nil else {
            context.writeAndFlush(wrapOutboundOut(.head(head)), promise: nil)
            return
        }
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if let body = request.body, body.readableBytes > 0 {
            context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        }
        let written = context.eventLoop.makePromise(of: Void.self)
        written.futureResult.assumeIsolated().whenFailure { [self] error in fail(error) }
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: written)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if !awaitsHandshake, context.channel.isActive { becomeReady() }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        // A connect that fails never makes the channel active (no `channelInactive`): whatever
        // still waits learns it here.
        fail(UpstreamError.connectFailed("connection closed"))
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        if !awaitsHandshake { becomeReady() }
        context.fireChannelActive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if awaitsHandshake, let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent {
            becomeReady()
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .exchanging(let exchange) = state else {
            // Bytes nobody asked for: the connection cannot be trusted to frame the next response.
            context.close(promise: nil)
            return
        }
        switch unwrapInboundIn(data) {
        case .head(let head):
            exchange.head = head  // 1xx never arrive (the decoder drops them), but 101
            if head.status == .switchingProtocols {
                guard exchange.upgrade else {
                    // A protocol switch nobody asked for: the bytes after it are not HTTP.
                    fail(UpstreamError.protocolError("101 Switching Protocols to a request that did not ask to upgrade"))
                    return
                }
                // Reads wait until the client's side joins (`RelayHandler`).
                cancelExchangeTimeout()
                readsPaused = true
                return
            }
            let limit = exchange.limit
            switch ResponseBodyPlan(head: head, requestIsHead: exchange.requestIsHead, limit: limit) {
            case .tooLarge:
                fail(UpstreamError.responseTooLarge(limit: limit))
            case .stream(let length):
                // Without a relay factory every body is collected whole.
                guard let makeRelay = exchange.makeRelay else { break }
                cancelExchangeTimeout()
                let channel = context.channel
                let relay = makeRelay(length) { channel.close(promise: nil) }
                let finished = context.eventLoop.makePromise(of: Bool.self)
                exchange.relay = relay
                exchange.finished = finished
                let complete = exchange.complete.take()
                complete?(.success(HTTP1Response(head: head, body: ByteBuffer(), stream: relay.stream, reusable: false,
                                                 finished: finished.futureResult)))
            case .buffer:
                break
            }
        case .body(let part):
            if let relay = exchange.relay {
                let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
                switch relay.deliver(part, resume: { handler.eventLoop.execute { handler.value.resumeReads() } }) {
                case .proceed: break
                case .pause: readsPaused = true
                case .stop: fail(CancellationError())
                }
                return
            }
            let collected = exchange.body?.readableBytes ?? 0
            guard collected + part.readableBytes <= exchange.limit else {
                fail(UpstreamError.responseTooLarge(limit: exchange.limit))
                return
            }
            if exchange.body == nil {
                exchange.body = part
            } else {
                exchange.body?.writeImmutableBuffer(part)
            }
        case .end:
            guard let head = exchange.head else {
                fail(UpstreamError.protocolError("no response head"))
                return
            }
            if head.status == .switchingProtocols {
                switchProtocols(head, exchange: exchange, context: context)
                return
            }
            cancelExchangeTimeout()
            let reusable = head.isKeepAlive && !exchange.requestAsksClose && context.channel.isActive
            state = reusable ? .idle : .closed
            if !reusable { context.close(promise: nil) }
            if let relay = exchange.relay {
                resumeReads()
                relay.finish()
                exchange.finished?.succeed(reusable)
            } else {
                exchange.complete.take()?(.success(HTTP1Response(head: head, body: exchange.body ?? ByteBuffer(),
                                                                 reusable: reusable)))
            }
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A server that closes without close_notify after a close-delimited body is common: the
        // decoder ends the body at EOF, which follows; a body cut short fails then too.
        if let tlsError = error as? NIOSSLError, case .uncleanShutdown = tlsError, case .exchanging = state { return }
        fail(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        switch state {
        case .connecting:
            fail(UpstreamError.connectFailed("connection closed during the TLS handshake"))
        case .exchanging(let exchange):
            fail(exchange.head == nil ? UpstreamError.connectionClosed("remote closed the connection")
                                      : UpstreamError.connectionClosed("closed before the body was complete"))
        case .idle, .closed:
            state = .closed
        case .upgraded:
            break
        }
        context.fireChannelInactive()
    }

    func read(context: ChannelHandlerContext) {
        if readsPaused {
            readHeld = true
        } else {
            context.read()
        }
    }

    private func resumeReads() {
        readsPaused = false
        if readHeld, let context {
            readHeld = false
            context.read()
        }
    }

    /// A 101 answered an upgrade request: the HTTP codecs and this handler leave the pipeline
    /// and a `RelayHandler` takes the connection's bytes (what the decoder had read past the head
    /// is forwarded to it as it is removed); the exchange completes with the tunnel.
    private func switchProtocols(_ head: HTTPResponseHead, exchange: ResponseInProgress, context: ChannelHandlerContext) {
        state = .upgraded
        cancelExchangeTimeout()
        let channel = context.channel
        let relay = RelayHandler(side: .upstream)
        let complete = exchange.complete.take()
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
                complete?(.failure(UpstreamError.connectionClosed("the connection closed as it switched protocols")))
                return
            }
            complete?(.success(HTTP1Response(head: head, body: ByteBuffer(), reusable: false,
                                             tunnel: UpstreamTunnel(channel: channel, relay: relay))))
        }
    }

    private func becomeReady() {
        guard case .connecting(let ready) = state else { return }
        handshakeTimeout?.cancel()
        state = .idle
        ready.succeed()
    }

    /// Fails whatever waits (the connect or the exchange) and closes the connection.
    private func fail(_ error: any Error) {
        let previous = state
        state = .closed
        handshakeTimeout?.cancel()
        cancelExchangeTimeout()
        switch previous {
        case .connecting(let ready):
            ready.fail(Self.kind(of: error, afterHead: false, limit: 0))
        case .exchanging(let failed):
            if let relay = failed.relay {
                // The response was handed on at its head: its reader hears of the failure.
                relay.fail(error)
                failed.finished?.succeed(false)
            } else {
                failed.complete.take()?(.failure(Self.kind(of: error, afterHead: failed.head != nil, limit: failed.limit)))
            }
        case .idle, .closed:
            if closedBy == nil { closedBy = error }
        case .upgraded:
            // Removed from the pipeline (`handlerRemoved`): the tunnel owns the connection now.
            state = .upgraded
            return
        }
        context?.close(promise: nil)
    }

    private func cancelExchangeTimeout() {
        exchangeTimeout?.cancel()
        exchangeTimeout = nil
    }

    /// The `UpstreamError` for `error` (`NIOUpstream.classify`); cancellation as is.
    static func kind(of error: any Error, afterHead: Bool, limit: Int) -> any Error {
        if let kind = NIOUpstream.classify(error, afterHead: afterHead, limit: limit) { return kind }
        return error
    }
}

extension HTTP1ExchangeHandler: NIOScheduledCallbackHandler {
    /// The exchange's deadline (`HTTP1Exchange.deadline`) has passed.
    func handleScheduledCallback(eventLoop: some EventLoop) {
        exchangeTimeout = nil
        guard case .exchanging = state else { return }
        fail(UpstreamError.timeout)
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
