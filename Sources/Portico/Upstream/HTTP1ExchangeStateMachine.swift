import NIOCore
import NIOHTTP1
import NIOHTTP2

// Over 450 lines on purpose: one pure state machine (its states, the events NIO delivers and the
// actions it returns) read as one transition table; its handler and tests live beside it.

/// The logic of one `HTTP1ExchangeHandler`, as a value: NIO's events come in as calls, what the
/// handler must do comes back as an `Action`. No channel, no timers, no promises: `Waiter` is
/// whoever hears an exchange's response and `Relay` where a streamed body's parts go (the
/// handler's completion and `StreamedResponseRelay`; names in tests). The machine only holds
/// them, in the state whose data they are, and hands them back when their moment comes.
///
/// A connection connects (TCP, then TLS's handshake when `awaitsHandshake`), then carries one
/// exchange at a time: the request goes out (`awaitingHead`); the head decides how the body
/// travels — collected whole (`buffering`), relayed as it comes (`streaming`, reads paused while
/// the relay's reader is behind), or, for a 101 to an upgrade request, not at all
/// (`switchingProtocols`, then `upgraded`: the connection leaves its pool for a tunnel) — and
/// the end says whether the connection may carry another request (`idle`) or not (`closed`).
/// A failure ends whatever waits and closes the connection. On a reused connection (one that
/// carried an exchange before), a failure before any byte of the response — the connection found
/// closed before the write, or ending after it — is a `StaleConnection`, which the pool may send
/// again on a new connection.
///
/// One timer at a time is asked of the handler: the handshake's limit while `connecting`, then
/// each exchange's deadline until its head streams or its end (`timerFired`). Every action that
/// leaves those states stops it.
///
/// Under 500 lines: one state machine, its events and actions, kept together.
struct HTTP1ExchangeStateMachine<Waiter, Relay> {
    /// What the machine keeps of a request once it is written.
    struct Exchange {
        var waiter: Waiter
        /// `max_response_bytes`.
        var limit: Int
        var requestIsHead: Bool
        /// The connection is not to carry another request after this one (`Connection: close`,
        /// a streamed upload, an upgrade).
        var asksClose: Bool
        /// The request asks to switch protocols: a 101 ends it with a tunnel.
        var upgrade: Bool
        /// The connection carried an exchange to its end before this one (set by `execute`): a failure
        /// before the response's first byte is then a `StaleConnection`.
        var reused = false
    }

    /// Whether the handler passes the channel's reads on.
    enum Reads: Equatable {
        case flowing
        /// Reads wait: the relay's reader is a high water behind, or a tunnel is to take the bytes.
        case paused
        /// Paused, and a read was asked for meanwhile: it goes on when reads resume (held, so
        /// TLS and the decoder see reads in order).
        case pausedHoldingRead

        /// A read is asked for: whether it goes on now, and the gate after it.
        fileprivate func asked() -> (pass: Bool, after: Reads) {
            self == .flowing ? (true, .flowing) : (false, .pausedHoldingRead)
        }
    }

    private enum State {
        /// Waiting for TCP (and TLS's handshake): `handshakeFailure` is what the timer's firing means.
        case connecting(handshakeFailure: UpstreamError?)
        case idle
        /// The request is written; no head yet.
        case awaitingHead(Exchange)
        /// A body collected whole (`nil` until its first part).
        case buffering(Exchange, HTTPResponseHead, body: ByteBuffer?)
        /// A 101 to an upgrade request, until its end; reads wait for the tunnel.
        case switchingProtocols(Exchange, HTTPResponseHead, Reads)
        /// The head was handed on with its relay; the parts follow it.
        case streaming(Streaming)
        /// Handed to a tunnel: the handler is on its way out of the pipeline.
        case upgraded
        /// `reason`: what closed the connection while no exchange ran (a TLS alert before the
        /// first request, say), the answer to a request that comes after it. `reads`: as they
        /// were when it closed (a resume still lets a held read go on).
        case closed(reason: (any Error)?, reads: Reads)
        /// Only inside a transition, while its state is out of the enum (`takeState`).
        case modifying

        /// Idle, or closed while idle or after an exchange's end.
        var isBetweenExchanges: Bool {
            switch self {
            case .idle, .closed: true
            case .connecting, .awaitingHead, .buffering, .switchingProtocols, .streaming, .upgraded, .modifying: false
            }
        }

        /// An exchange is under way (its request written, its response not handed over whole).
        var isExchanging: Bool {
            switch self {
            case .awaitingHead, .buffering, .switchingProtocols, .streaming: true
            case .connecting, .idle, .upgraded, .closed, .modifying: false
            }
        }
    }

    struct Streaming {
        var relay: Relay
        /// Keep-alive on both sides: the connection may carry another request if still open at the end.
        var keepAlive: Bool
        var reads: Reads
    }

    /// What to do next; each case says everything, in the order the handler does it.
    enum Action {
        case none
        /// Pass on the read that was held.
        case read
        /// Close the connection: bytes arrived that no exchange asked for (it cannot be trusted
        /// to frame the next response).
        case close
        /// The connection can carry a request: stop the timer, succeed `ready`.
        case ready
        /// A 101 to an upgrade request: stop the timer; reads wait for the tunnel.
        case stopTimer
        /// The head of a body that streams: stop the timer, answer with the head and `Relay`'s stream.
        case streamResponse(Waiter, HTTPResponseHead, Relay)
        /// A streamed body's part: give it to the relay, then tell the machine `readerBehind`
        /// or `failed` as the relay says.
        case deliver(Relay, ByteBuffer)
        /// The whole response: stop the timer, close unless `reusable`, answer.
        case respond(Waiter, HTTPResponseHead, ByteBuffer, reusable: Bool)
        /// A streamed body's end: stop the timer, close unless `reusable`, pass a held read on
        /// when `read`, finish the relay and say whether the connection may be reused.
        case finishStream(Relay, reusable: Bool, read: Bool)
        /// The end of a 101: stop the timer, hand the connection to a tunnel and answer with it.
        case switchProtocols(Waiter, HTTPResponseHead)
        /// Stop the timer, tell whoever waited, close.
        case fail(Failure)
    }

    /// Who hears of a failure, and what (mapped to an `UpstreamError` where a kind applies).
    enum Failure {
        /// The connect: `ready` fails.
        case ready(any Error)
        case waiter(Waiter, any Error)
        /// The head was handed on: the relay's reader hears the error, after the bytes before it.
        case relay(Relay, any Error)
        /// Nobody waits.
        case connection
    }

    /// What `execute` says.
    enum Start {
        /// Write the request; with a deadline, start the timer for it first.
        case send(deadline: NIODeadline?)
        /// The connection cannot take it: answer the waiter with this and leave the connection be.
        case refuse(Waiter, any Error)
    }

    /// Where the machine is, for tests and checks (the states without their data).
    enum Phase: Equatable {
        case connecting, idle, awaitingHead, buffering, switchingProtocols, streaming(Reads), upgraded, closed(Reads)
    }

    /// With TLS: ready at its handshake's end, not when TCP is up.
    let awaitsHandshake: Bool
    private var state: State
    /// The connection has carried an exchange to its end and was kept: the next one is on a
    /// reused connection.
    private(set) var isReused = false

    init(awaitsHandshake: Bool) {
        self.awaitsHandshake = awaitsHandshake
        state = .connecting(handshakeFailure: nil)
    }

    var phase: Phase {
        switch state {
        case .connecting: .connecting
        case .idle: .idle
        case .awaitingHead: .awaitingHead
        case .buffering: .buffering
        case .switchingProtocols: .switchingProtocols
        case .streaming(let streaming): .streaming(streaming.reads)
        case .upgraded: .upgraded
        case .closed(_, let reads): .closed(reads)
        case .modifying: preconditionFailure("HTTP1ExchangeStateMachine left in a transition")
        }
    }

    // MARK: Connecting

    /// The connect fails with `failure` unless it is ready in time (the TCP connect timeout alone
    /// does not cover TLS). `true`: start the timer.
    mutating func limitHandshake(failure: UpstreamError) -> Bool {
        guard case .connecting = state else { return false }
        state = .connecting(handshakeFailure: failure)
        return true
    }

    /// The channel is active (or was when the handler joined the pipeline).
    mutating func channelActive() -> Action {
        awaitsHandshake ? .none : becomeReady()
    }

    /// TLS's handshake is done (and the peer-certificate checks before the handler satisfied).
    mutating func handshakeCompleted() -> Action {
        awaitsHandshake ? becomeReady() : .none
    }

    private mutating func becomeReady() -> Action {
        guard case .connecting = state else { return .none }
        state = .idle
        return .ready
    }

    // MARK: An exchange

    /// A request for this connection; it is taken only when the connection is idle and open.
    /// `peerHasClosed`: the kernel already has the server's FIN or reset (`PeerLiveness`), which
    /// the loop has not read yet. Refused on a reused connection, the request is a
    /// `StaleConnection` found `beforeWrite`: nothing of it went out.
    mutating func execute(_ exchange: Exchange, deadline: NIODeadline?, channelIsActive: Bool,
                          peerHasClosed: Bool = false) -> Start {
        guard case .idle = state, channelIsActive, !peerHasClosed else {
            var failure: any Error = UpstreamError.connectionClosed("pooled connection no longer usable")
            // A TLS 1.3 server refuses a client certificate after the handshake: its alert can
            // close a new connection before the first request; that reason is the answer.
            if case .closed(let reason?, _) = state { failure = Self.kind(of: reason, afterHead: false, limit: 0) }
            // Between exchanges only (never a second request on a busy connection).
            if isReused, state.isBetweenExchanges, let failure = failure as? UpstreamError {
                return .refuse(exchange.waiter, StaleConnection(moment: .beforeWrite, failure: failure))
            }
            return .refuse(exchange.waiter, failure)
        }
        var exchange = exchange
        exchange.reused = isReused
        state = .awaitingHead(exchange)
        return .send(deadline: deadline)
    }

    /// A response head. `openRelay` makes the relay for a body that streams, given its declared
    /// length (`nil` from it: every body is collected whole); called at most once, at once.
    mutating func receivedHead(_ head: HTTPResponseHead, openRelay: (Waiter, _ length: Int?) -> Relay?) -> Action {
        switch takeState() {
        case .awaitingHead(let exchange):
            // 1xx never arrive (the decoder drops them), but 101.
            if head.status == .switchingProtocols {
                // A protocol switch nobody asked for: the bytes after it are not HTTP.
                guard exchange.upgrade else {
                    return fail(UpstreamError.protocolError("101 Switching Protocols to a request that did not ask to upgrade"),
                                from: .awaitingHead(exchange))
                }
                state = .switchingProtocols(exchange, head, .paused)
                return .stopTimer
            }
            switch ResponseBodyPlan(head: head, requestIsHead: exchange.requestIsHead, limit: exchange.limit) {
            case .tooLarge:
                return fail(UpstreamError.responseTooLarge(limit: exchange.limit), from: .awaitingHead(exchange))
            case .stream(let length):
                guard let relay = openRelay(exchange.waiter, length) else { break }
                state = .streaming(Streaming(relay: relay, keepAlive: head.isKeepAlive && !exchange.asksClose, reads: .flowing))
                return .streamResponse(exchange.waiter, head, relay)
            case .buffer:
                break
            }
            state = .buffering(exchange, head, body: nil)
            return .none
        case let busy where busy.isExchanging:
            return fail(UpstreamError.protocolError("a second response head"), from: busy)
        case let other:
            state = other
            return .close
        }
    }

    /// A part of the response body.
    mutating func receivedBody(_ part: ByteBuffer) -> Action {
        switch takeState() {
        case .buffering(let exchange, let head, var body):
            guard (body?.readableBytes ?? 0) + part.readableBytes <= exchange.limit else {
                return fail(UpstreamError.responseTooLarge(limit: exchange.limit), from: .buffering(exchange, head, body: body))
            }
            // Out of the enum, the buffer is referenced once: it grows in place.
            if body == nil {
                body = part
            } else {
                body?.writeImmutableBuffer(part)
            }
            state = .buffering(exchange, head, body: body)
            return .none
        case .streaming(let streaming):
            let relay = streaming.relay
            state = .streaming(streaming)
            return .deliver(relay, part)
        case .switchingProtocols(let exchange, let head, let reads):
            // The decoder ends a 101 at its head; what follows goes to the tunnel, not here.
            state = .switchingProtocols(exchange, head, reads)
            return .none
        case .awaitingHead(let exchange):
            return fail(UpstreamError.protocolError("no response head"), from: .awaitingHead(exchange))
        case let other:
            state = other
            return .close
        }
    }

    /// The response's end. `channelIsActive`: the connection is still open (else it cannot be reused).
    mutating func receivedEnd(channelIsActive: Bool) -> Action {
        switch takeState() {
        case .buffering(let exchange, let head, let body):
            let reusable = head.isKeepAlive && !exchange.asksClose && channelIsActive
            state = reusable ? .idle : .closed(reason: nil, reads: .flowing)
            if reusable { isReused = true }
            return .respond(exchange.waiter, head, body ?? ByteBuffer(), reusable: reusable)
        case .streaming(let streaming):
            let reusable = streaming.keepAlive && channelIsActive
            state = reusable ? .idle : .closed(reason: nil, reads: .flowing)
            if reusable { isReused = true }
            return .finishStream(streaming.relay, reusable: reusable, read: streaming.reads == .pausedHoldingRead)
        case .switchingProtocols(let exchange, let head, _):
            state = .upgraded
            return .switchProtocols(exchange.waiter, head)
        case .awaitingHead(let exchange):
            return fail(UpstreamError.protocolError("no response head"), from: .awaitingHead(exchange))
        case let other:
            state = other
            return .close
        }
    }

    // MARK: Reads

    /// The channel asks to read: `true` to pass it on now (else it is held).
    mutating func read() -> Bool {
        switch takeState() {
        case .streaming(var streaming):
            defer { state = .streaming(streaming) }
            guard streaming.reads != .flowing else { return true }
            streaming.reads = .pausedHoldingRead
            return false
        case .switchingProtocols(let exchange, let head, _):
            state = .switchingProtocols(exchange, head, .pausedHoldingRead)
            return false
        case .closed(let reason, let reads):
            let (pass, after) = reads.asked()
            state = .closed(reason: reason, reads: after)
            return pass
        case .upgraded:
            // The tunnel's relay reads for itself once it joins.
            state = .upgraded
            return false
        case let other:
            state = other
            return true
        }
    }

    /// The relay's reader is a high water behind (its `deliver` said pause): reads wait until
    /// `readerCaughtUp`.
    mutating func readerBehind() {
        switch takeState() {
        case .streaming(var streaming):
            if streaming.reads == .flowing { streaming.reads = .paused }
            state = .streaming(streaming)
        case let other:
            state = other
        }
    }

    /// The relay's reader took the queue down: reads go on (`.read` when one was held).
    mutating func readerCaughtUp() -> Action {
        switch takeState() {
        case .streaming(var streaming):
            let held = streaming.reads == .pausedHoldingRead
            streaming.reads = .flowing
            state = .streaming(streaming)
            return held ? .read : .none
        case .closed(let reason, let reads):
            state = .closed(reason: reason, reads: .flowing)
            return reads == .pausedHoldingRead ? .read : .none
        case let other:
            // Not this exchange's pause (a tunnel's, or none): a late resume from an earlier
            // relay changes nothing.
            state = other
            return .none
        }
    }

    // MARK: Endings

    /// The timer asked for has fired.
    mutating func timerFired() -> Action {
        switch takeState() {
        case .connecting(let failure?):
            return fail(failure, from: .connecting(handshakeFailure: failure))
        case .awaitingHead(let exchange):
            return fail(UpstreamError.timeout, from: .awaitingHead(exchange))
        case .buffering(let exchange, let head, let body):
            return fail(UpstreamError.timeout, from: .buffering(exchange, head, body: body))
        case let other:
            state = other
            return .none
        }
    }

    /// An error in the pipeline. `uncleanShutdown`: TLS ended without close_notify, which a
    /// server that closes after a close-delimited body commonly does: while an exchange runs the
    /// decoder ends the body at the EOF that follows (a body cut short fails then too).
    mutating func errorCaught(_ error: any Error, uncleanShutdown: Bool) -> Action {
        if uncleanShutdown, state.isExchanging { return .none }
        return fail(error, from: takeState())
    }

    /// The connection closed.
    mutating func channelInactive() -> Action {
        switch takeState() {
        case .connecting(let failure):
            return fail(UpstreamError.connectFailed("connection closed during the TLS handshake"),
                        from: .connecting(handshakeFailure: failure))
        case .awaitingHead(let exchange):
            return fail(Self.remoteClosed, from: .awaitingHead(exchange))
        case let busy where busy.isExchanging:
            return fail(UpstreamError.connectionClosed("closed before the body was complete"), from: busy)
        case .idle:
            state = .closed(reason: nil, reads: .flowing)
            return .none
        case let other:
            state = other
            return .none
        }
    }

    /// The handler left the pipeline. A connect that fails never makes the channel active (no
    /// `channelInactive`): whatever still waits learns it here.
    mutating func handlerRemoved() -> Action {
        fail(UpstreamError.connectFailed("connection closed"), from: takeState())
    }

    /// Something failed (a write, the deadline's timer could not be set, the relay's reader went
    /// away: `CancellationError`): whatever waits hears `error`, and the connection closes.
    mutating func failed(_ error: any Error) -> Action {
        fail(error, from: takeState())
    }

    /// Ends `taken` (the state, taken out) for `error` and stores the state after it.
    private mutating func fail(_ error: any Error, from taken: consuming State) -> Action {
        switch consume taken {
        case .connecting:
            state = .closed(reason: nil, reads: .flowing)
            return .fail(.ready(Self.kind(of: error, afterHead: false, limit: 0)))
        case .awaitingHead(let exchange):
            state = .closed(reason: nil, reads: .flowing)
            let failure = Self.kind(of: error, afterHead: false, limit: exchange.limit)
            // No byte of the response came (a head would have moved on; a partial one fails the
            // parser instead): the connection ended under a request written on a reused connection.
            if exchange.reused, Self.endsConnection(error), let failure = failure as? UpstreamError {
                return .fail(.waiter(exchange.waiter, StaleConnection(moment: .afterWrite, failure: failure)))
            }
            return .fail(.waiter(exchange.waiter, failure))
        case .buffering(let exchange, _, _):
            state = .closed(reason: nil, reads: .flowing)
            return .fail(.waiter(exchange.waiter, Self.kind(of: error, afterHead: true, limit: exchange.limit)))
        case .switchingProtocols(let exchange, _, let reads):
            state = .closed(reason: nil, reads: reads)
            return .fail(.waiter(exchange.waiter, Self.kind(of: error, afterHead: true, limit: exchange.limit)))
        case .streaming(let streaming):
            // The relay maps the error itself (as after the head).
            state = .closed(reason: nil, reads: streaming.reads)
            return .fail(.relay(streaming.relay, error))
        case .idle:
            state = .closed(reason: error, reads: .flowing)
            return .fail(.connection)
        case .closed(let reason, let reads):
            state = .closed(reason: reason ?? error, reads: reads)
            return .fail(.connection)
        case .upgraded:
            // The tunnel owns the connection now.
            state = .upgraded
            return .none
        case .modifying:
            preconditionFailure("HTTP1ExchangeStateMachine re-entered in a transition")
        }
    }

    /// Moves the state out for a transition, leaving `.modifying` until the transition stores
    /// the next one: its payload moves rather than being copied. (A copy goes through the enum's
    /// outlined value witness and retains every reference in the payload: switching on `state`
    /// in place cost 0.8k instructions more a proxied request, measured as bench/instructions
    /// does.) Every path of a transition that takes the state stores one.
    private mutating func takeState() -> State {
        var taken = State.modifying
        swap(&state, &taken)
        if case .modifying = taken { preconditionFailure("HTTP1ExchangeStateMachine re-entered in a transition") }
        return taken
    }

    /// The `UpstreamError` for `error` (`NIOUpstream.classify`); cancellation as is.
    static func kind(of error: any Error, afterHead: Bool, limit: Int) -> any Error {
        // An HTTP/2 stream the upstream refused unread: its pool sends it again (before any byte of a response only).
        if !afterHead, let refused = HTTP2StreamRefused.from(error) { return refused }
        if !afterHead, let closed = error as? NIOHTTP2Errors.StreamClosed, closed.errorCode == .cancel {
            return HTTP2ConnectionLost(failure: .connectionClosed("the HTTP/2 connection closed before the response"))
        }
        return NIOUpstream.classify(error, afterHead: afterHead, limit: limit) ?? error
    }

    /// What `channelInactive` fails an exchange waiting for its head with.
    static var remoteClosed: UpstreamError { .connectionClosed("remote closed the connection") }

    /// `error` ended the connection itself (EOF, reset, broken pipe), not the exchange's bytes.
    /// A reset after part of a head is taken for one too: the decoder holds those bytes unseen,
    /// and nginx likewise retries an idempotent request whose response header failed to arrive.
    private static func endsConnection(_ error: any Error) -> Bool {
        (error as? UpstreamError) == remoteClosed || StaleConnection.endsConnection(error)
    }
}
