import NIOCore
import NIOHTTP1
import NIOSSL
import NIOTLS

/// The last handler of an `HTTP1Connection`'s pipeline: says when the connection is ready
/// (TCP up, and with TLS the handshake done and `ServerNameVerificationHandler` satisfied), then
/// runs one exchange at a time: writes the request, collects the response head and body up to
/// a limit, and reports whether the connection may carry another request.
///
/// Every method runs on the channel's event loop. Failures reach the waiting promise as
/// `UpstreamError` (via `NIOUpstream.classify`) where a kind applies.
final class HTTP1ExchangeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    private struct Exchange {
        var promise: EventLoopPromise<HTTP1Response>
        var limit: Int
        var requestAsksClose: Bool
        var head: HTTPResponseHead?
        var body: ByteBuffer?
    }

    private enum State {
        /// Waiting for TCP (and the TLS handshake, when `awaitsHandshake`).
        case connecting(EventLoopPromise<Void>)
        case idle
        case exchanging(Exchange)
        case closed
    }

    private var state: State
    /// Succeeds once the connection can carry a request.
    let ready: EventLoopFuture<Void>
    private let awaitsHandshake: Bool
    private var context: ChannelHandlerContext?
    private var handshakeTimeout: Scheduled<Void>?

    /// `ready` succeeds once the connection can carry a request; with `awaitsHandshake` that
    /// is after `TLSUserEvent.handshakeCompleted`, otherwise when the channel is active.
    init(ready: EventLoopPromise<Void>, awaitsHandshake: Bool) {
        self.state = .connecting(ready)
        self.ready = ready.futureResult
        self.awaitsHandshake = awaitsHandshake
    }

    /// Fails `ready` with `UpstreamError.connectTimeout` (and closes) if the handshake is not
    /// done within `timeout`: the TCP connect timeout alone does not cover TLS.
    func limitHandshake(to timeout: TimeAmount, on eventLoop: any EventLoop) {
        guard case .connecting = state else { return }
        handshakeTimeout = eventLoop.assumeIsolated().scheduleTask(in: timeout) { [self] in
            fail(UpstreamError.connectTimeout)
        }
    }

    /// Sends one request; `promise` gets the response (or the failure).
    func execute(_ head: HTTPRequestHead, body: ByteBuffer?, limit: Int, promise: EventLoopPromise<HTTP1Response>) {
        guard case .idle = state, let context, context.channel.isActive else {
            promise.fail(UpstreamError.connectionClosed("pooled connection no longer usable"))
            return
        }
        let asksClose = !head.isKeepAlive
        state = .exchanging(Exchange(promise: promise, limit: limit, requestAsksClose: asksClose))
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        if let body, body.readableBytes > 0 {
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
        guard case .exchanging(var exchange) = state else {
            // Bytes nobody asked for: the connection cannot be trusted to frame the next response.
            context.close(promise: nil)
            return
        }
        switch unwrapInboundIn(data) {
        case .head(let head):
            exchange.head = head  // 1xx never arrive: the decoder drops them
            state = .exchanging(exchange)
        case .body(let part):
            let collected = exchange.body?.readableBytes ?? 0
            guard collected + part.readableBytes <= exchange.limit else {
                fail(UpstreamError.responseTooLarge(limit: exchange.limit))
                return
            }
            if exchange.body == nil {
                exchange.body = part
            } else {
                exchange.body!.writeImmutableBuffer(part)
            }
            state = .exchanging(exchange)
        case .end:
            guard let head = exchange.head else {
                fail(UpstreamError.protocolError("no response head"))
                return
            }
            let reusable = head.isKeepAlive && !exchange.requestAsksClose && context.channel.isActive
            state = reusable ? .idle : .closed
            if !reusable { context.close(promise: nil) }
            exchange.promise.succeed(HTTP1Response(head: head, body: exchange.body ?? ByteBuffer(), reusable: reusable))
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
        }
        context.fireChannelInactive()
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
        switch previous {
        case .connecting(let ready):
            ready.fail(Self.kind(of: error, afterHead: false, limit: 0))
        case .exchanging(let exchange):
            exchange.promise.fail(Self.kind(of: error, afterHead: exchange.head != nil, limit: exchange.limit))
        case .idle, .closed:
            break
        }
        context?.close(promise: nil)
    }

    /// The `UpstreamError` for `error`, as the AsyncHTTPClient path classifies it; cancellation as is.
    static func kind(of error: any Error, afterHead: Bool, limit: Int) -> any Error {
        if let kind = NIOUpstream.classify(error, afterHead: afterHead, limit: limit) { return kind }
        return error
    }
}

/// One upstream response, collected whole.
struct HTTP1Response: Sendable {
    var head: HTTPResponseHead
    var body: ByteBuffer
    /// The connection may carry another request (keep-alive on both sides, still open).
    var reusable: Bool
}
