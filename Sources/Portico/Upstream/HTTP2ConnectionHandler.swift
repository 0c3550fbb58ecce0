import NIOCore
import NIOHPACK
import NIOHTTP2
import NIOTLS

/// The last handler of an `HTTP2Connection`'s pipeline. It starts HTTP/2 — at once on a
/// cleartext connection (prior knowledge), after the TLS handshake when ALPN chose `h2` (else
/// the connect fails with `HTTP2Unavailable`) — by putting NIOHTTP2's handler before itself;
/// then it says when the connection is ready, tells the pool of the peer's SETTINGS and of
/// GOAWAY, and keeps the connection honest with PING: after `ping_interval` without a frame
/// from the peer it sends one, and a connection that stays silent `ping_timeout` longer is
/// closed (its streams fail; the pool opens another connection for the next request).
///
/// **When it is ready.** Over TLS, as soon as ALPN chose `h2`: the server has said it speaks
/// HTTP/2, and the first requests go out beside the preface instead of a round trip later,
/// after the server's SETTINGS (RFC 9113 §3.4 lets a client send before it has them). Until
/// they come the peer's stream limit is taken to be `HTTP2Connection.assumedPeerStreams` (100,
/// the least §6.5.2 recommends, and the limit NIOHTTP2 itself holds its outbound streams to
/// meanwhile); the SETTINGS then set it, lower or higher. They are still due within the
/// connect's timeout: without them the connection ends with the timeout's failure. In cleartext
/// (prior knowledge) only the peer's SETTINGS prove it speaks HTTP/2 at all, so the connection
/// waits for them.
///
/// Every method runs on the channel's event loop.
final class HTTP2ConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = HTTP2Frame
    typealias OutboundIn = HTTP2Frame
    typealias OutboundOut = HTTP2Frame

    private enum State {
        /// TLS: waiting for the handshake and its ALPN choice.
        case negotiating
        /// Cleartext, HTTP/2 started: waiting for the peer's SETTINGS before it is ready.
        case awaitingSettings
        /// TLS chose h2: ready, streams going out; the peer's first SETTINGS not in yet.
        case activeBeforeSettings
        case active
        case closed
    }

    private var isReady: Bool {
        switch state {
        case .activeBeforeSettings, .active: true
        case .negotiating, .awaitingSettings, .closed: false
        }
    }

    private var state: State
    private let ready: EventLoopPromise<Int?>
    private let configuration: HTTP2Config
    private let events: HTTP2Connection.Events
    private let streams: NIOLoopBoundBox<HTTP2StreamsHandler?>
    private let failure: HTTP2Connection.Failure
    private let isTLS: Bool
    private var context: ChannelHandlerContext?
    private var startTimer: Scheduled<Void>?
    private var keepalive: RepeatedTask?
    private var pingDeadline: Scheduled<Void>?
    /// A frame arrived since the last keepalive tick.
    private var heardFromPeer = true
    /// NIOHTTP2's handler is in front of this one: reads are frames from then on.
    private var started = false

    init(ready: EventLoopPromise<Int?>, configuration: HTTP2Config, events: HTTP2Connection.Events,
         streams: NIOLoopBoundBox<HTTP2StreamsHandler?>, failure: HTTP2Connection.Failure, isTLS: Bool) {
        self.ready = ready
        self.configuration = configuration
        self.events = events
        self.streams = streams
        self.isTLS = isTLS
        self.failure = failure
        state = isTLS ? .negotiating : .awaitingSettings
    }

    /// Fails the connect with `failure` unless the connection is ready within `timeout` (the
    /// TCP connect timeout covers neither TLS nor, in cleartext, the peer's SETTINGS). Over TLS
    /// the peer's first SETTINGS are due within the same `timeout`: a server that chose h2 and
    /// then says nothing ends the connection with `failure`, the streams sent on it too, rather
    /// than holding each of them to its own deadline.
    func limitStart(to timeout: TimeAmount, failure: UpstreamError, on eventLoop: any EventLoop) {
        let handler = NIOLoopBound(self, eventLoop: eventLoop)
        startTimer = eventLoop.scheduleTask(in: timeout) {
            handler.value.startTimedOut(failure)
        }
    }

    private func startTimedOut(_ timeout: UpstreamError) {
        startTimer = nil
        switch state {
        case .negotiating, .awaitingSettings:
            fail(timeout)
        case .activeBeforeSettings:
            failure.record(timeout)
            events.goAway()
            context?.close(promise: nil)
        case .active, .closed:
            break
        }
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if context.channel.isActive, case .awaitingSettings = state, streams.value == nil { startHTTP2(context: context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        if case .awaitingSettings = state, streams.value == nil { startHTTP2(context: context) }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        fail(UpstreamError.connectionClosed("the upstream closed the connection"))
        state = .closed
        stopTimers()
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let tls = event as? TLSUserEvent, case .handshakeCompleted(let negotiated) = tls, case .negotiating = state {
            guard negotiated == "h2" else {
                fail(HTTP2Unavailable(negotiated: negotiated))
                return
            }
            startHTTP2(context: context)
            if started { becomeReady(.activeBeforeSettings, peerLimit: HTTP2Connection.assumedPeerStreams, context: context) }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard isReady else {
            fail(NIOUpstream.classify(error, afterHead: false, limit: 0) ?? error)
            context.close(promise: nil)
            return
        }
        // TLS 1.3: a server judges our certificate (mTLS) after our side of the handshake has
        // finished, so its refusal comes after the connection was ready, before its SETTINGS.
        // It is the connect's failure (`upstream_tls_error`), as it would be had we waited.
        if case .activeBeforeSettings = state, let tls = TLSFailure.describe(nioError: error) {
            failure.record(.tls(tls))
            events.goAway()
            context.close(promise: nil)
            return
        }
        // The upstream broke the framing, the header compression's shared state or one of
        // NIOHTTP2's flood limits: NIOHTTP2 has sent GOAWAY, and nothing more it sends can be
        // trusted (a flood would go on). Closed now: its streams' callers hear why
        // (`upstream_protocol_error`), not the CANCEL of their close.
        if Self.endsConnection(error) {
            failure.record(.protocolError("HTTP/2: \(type(of: error))"))
            events.goAway()
            context.close(promise: nil)
            return
        }
        // NIOHTTP2 reports a stream's error here too (it has reset that stream) as well as the
        // connection's other errors (it has sent GOAWAY): neither ends the other streams at once.
        // The connection drains — no new stream, closed by the pool at its last stream's end
        // (each bounded by its request's deadline) — and a broken socket closes it on its own.
        events.goAway()
    }

    /// NIOHTTP2's errors that are always the connection's, never one stream's: an unparseable
    /// frame, HPACK's (its tables are the connection's), a SETTINGS value out of range, and each
    /// limit of `HTTP2Connection.connectionConfiguration()`.
    static func endsConnection(_ error: any Error) -> Bool {
        switch error {
        case is NIOHTTP2Errors.UnableToParseFrame, is NIOHTTP2Errors.ExcessivelyLargeHeaderBlock,
             is NIOHTTP2Errors.ExcessiveContinuationFrames, is NIOHTTP2Errors.ExcessiveControlFrames,
             is NIOHTTP2Errors.ExcessiveRSTFrames, is NIOHTTP2Errors.ExcessiveEmptyDataFrames,
             is NIOHTTP2Errors.ExcessiveStreamErrors, is NIOHTTP2Errors.ExcessiveNumberOfGlitches,
             is NIOHTTP2Errors.ExcessiveOutboundFrameBuffering, is NIOHTTP2Errors.InvalidSetting,
             is any NIOHPACKError:
            true
        default:
            false
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Before HTTP/2 starts, a read is the TLS connection's bytes: an h2 server sends its
        // SETTINGS right after the handshake, and they come here when a certificate check (pins,
        // server_name) refused the peer and withheld the handshake event. Unwrapped as a frame,
        // they trapped the process; the connection is closing: dropped.
        guard started else { return }
        heardFromPeer = true
        pingDeadline?.cancel()
        pingDeadline = nil
        let frame = unwrapInboundIn(data)
        switch frame.payload {
        case .settings(.settings(let settings)):
            let limit = settings.last(where: { $0.parameter == .maxConcurrentStreams }).map { $0.value }
            switch state {
            case .awaitingSettings:
                becomeReady(.active, peerLimit: limit, context: context)
            case .activeBeforeSettings:
                // The first SETTINGS: the limit they carry replaces the assumed one (none: unlimited).
                state = .active
                startTimer?.cancel()
                startTimer = nil
                events.settings(limit)
            case .active:
                // A later SETTINGS without the parameter leaves the limit as it was.
                if let limit { events.settings(limit) }
            case .negotiating, .closed:
                break
            }
        case .goAway:
            events.goAway()
        default:
            break
        }
    }

    /// Bytes came: the peer is alive, whichever streams its frames were on (`HTTP2StreamsHandler`
    /// passes on only the connection's own).
    func channelReadComplete(context: ChannelHandlerContext) {
        if started {
            heardFromPeer = true
            pingDeadline?.cancel()
            pingDeadline = nil
        }
        context.fireChannelReadComplete()
    }

    // MARK: Parts

    /// The connect succeeds: the pool may open streams, up to `peerLimit` (`nil`: unlimited).
    private func becomeReady(_ next: State, peerLimit: Int?, context: ChannelHandlerContext) {
        state = next
        if case .active = next {
            startTimer?.cancel()
            startTimer = nil
        }
        startKeepalive(context: context)
        ready.succeed(peerLimit)
    }

    /// Puts NIOHTTP2's handler (in its frame mode: no stream channels, and so no stream pushed
    /// to us, which our SETTINGS refuse anyway) and the `HTTP2StreamsHandler` before this one.
    private func startHTTP2(context: ChannelHandlerContext) {
        do {
            let handler = NIOHTTP2Handler(mode: .client, connectionConfiguration: HTTP2Connection.connectionConfiguration(),
                                          streamConfiguration: HTTP2Connection.streamConfiguration())
            let streamsHandler = HTTP2StreamsHandler(isTLS: isTLS)
            try context.pipeline.syncOperations.addHandler(handler, position: .before(self))
            try context.pipeline.syncOperations.addHandler(streamsHandler, position: .before(self))
            started = true
            streams.value = streamsHandler
            // The connection's window starts at RFC 9113's 65,535 bytes and NIOHTTP2 raises it to
            // its target only once DATA arrives: a burst of responses would stall on it for a
            // round trip. Opened whole at once, right after the preface and our SETTINGS.
            let increment = HTTP2Connection.connectionWindow - HTTP2Connection.defaultWindow
            context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: .rootStream,
                                                             payload: .windowUpdate(windowSizeIncrement: increment))),
                                  promise: nil)
        } catch {
            fail(error)
            context.close(promise: nil)
        }
    }

    /// Every `ping_interval`: a PING if the peer sent nothing since the last tick, and a close
    /// if it answers nothing within `ping_timeout`.
    private func startKeepalive(context: ChannelHandlerContext) {
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let interval = TimeAmount(configuration.pingInterval)
        keepalive = context.eventLoop.scheduleRepeatedTask(initialDelay: interval, delay: interval) { _ in
            handler.value.keepaliveTick()
        }
    }

    private func keepaliveTick() {
        guard let context, isReady else { return }
        if heardFromPeer {
            heardFromPeer = false
            return
        }
        guard pingDeadline == nil else { return }
        context.writeAndFlush(wrapOutboundOut(HTTP2Frame(streamID: .rootStream, payload: .ping(HTTP2PingData(), ack: false))),
                              promise: nil)
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        pingDeadline = context.eventLoop.scheduleTask(in: TimeAmount(configuration.pingTimeout)) {
            handler.value.pingUnanswered()
        }
    }

    private func pingUnanswered() {
        pingDeadline = nil
        context?.close(promise: nil)
    }

    /// Fails the connect if it is still under way, and closes.
    private func fail(_ error: any Error) {
        switch state {
        case .negotiating, .awaitingSettings:
            state = .closed
            stopTimers()
            ready.fail(error)
            context?.close(promise: nil)
        case .activeBeforeSettings, .active, .closed:
            break
        }
    }

    private func stopTimers() {
        startTimer?.cancel()
        startTimer = nil
        keepalive?.cancel()
        keepalive = nil
        pingDeadline?.cancel()
        pingDeadline = nil
    }
}
