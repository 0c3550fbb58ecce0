import Foundation
import NIOCore
import NIOHTTP1
import Testing
@testable import Portico

/// The HTTP/1 exchange's logic without a channel: `HTTP1ExchangeStateMachine` driven with waiters
/// and relays named by strings, its actions compared as words ("respond(w1, 200, hello, reusable)").
/// Over 450 lines: every transition of the machine in one suite, next to the words it is read in.
/// (`read()` is mutating, so its results are named before `#expect` looks at them.)
@Suite("HTTP/1 exchange state machine")
struct HTTP1ExchangeStateMachineTests {
    typealias Machine = HTTP1ExchangeStateMachine<String, String>

    static let deadline = NIODeadline.uptimeNanoseconds(5_000_000_000)
    static let limit = 1024 * 1024

    static func head(_ status: HTTPResponseStatus = .ok, _ headers: [(String, String)] = []) -> HTTPResponseHead {
        HTTPResponseHead(version: .http1_1, status: status, headers: HTTPHeaders(headers))
    }

    static func exchange(_ waiter: String = "w1", limit: Int = limit, requestIsHead: Bool = false, asksClose: Bool = false,
                         upgrade: Bool = false) -> Machine.Exchange {
        Machine.Exchange(waiter: waiter, limit: limit, requestIsHead: requestIsHead, asksClose: asksClose, upgrade: upgrade)
    }

    /// A connection ready without TLS.
    static func ready() -> Machine {
        var machine = Machine(awaitsHandshake: false)
        #expect(Self.describe(machine.channelActive()) == "ready")
        return machine
    }

    /// A ready connection with `exchange` written.
    static func sent(_ exchange: Machine.Exchange = exchange()) -> Machine {
        var machine = ready()
        #expect(Self.describe(machine.execute(exchange, deadline: deadline, channelIsActive: true)) == "send(5000000000)")
        return machine
    }

    /// Relays opened (their names) by `openRelay`, which names them r1, r2, … (`nil` when `streams` is false).
    final class Relays {
        var opened: [String] = []
        var streams = true
        func open(_ waiter: String, _ length: Int?) -> String? {
            guard streams else { return nil }
            opened.append("r\(opened.count + 1)(\(waiter), \(length.map(String.init) ?? "chunked"))")
            return "r\(opened.count)"
        }
    }

    /// A connection whose response (declared `length`, or chunked) streams to relay r1.
    static func streaming(length: Int? = 1_000_000, _ exchange: Machine.Exchange = exchange()) -> Machine {
        var machine = sent(exchange)
        let relays = Relays()
        let headers = length.map { [("content-length", String($0))] } ?? [("transfer-encoding", "chunked")]
        #expect(Self.describe(machine.receivedHead(head(.ok, headers), openRelay: relays.open)) == "stream(w1, 200, r1)")
        return machine
    }

    static func buffer(_ text: String) -> ByteBuffer { ByteBuffer(string: text) }

    static func describe(_ start: Machine.Start) -> String {
        switch start {
        case .send(let deadline): "send(\(deadline.map { String($0.uptimeNanoseconds) } ?? "none"))"
        case .refuse(let waiter, let error): "refuse(\(waiter), \(error))"
        }
    }

    static func describe(_ action: Machine.Action) -> String {
        switch action {
        case .none: "none"
        case .read: "read"
        case .close: "close"
        case .ready: "ready"
        case .stopTimer: "stopTimer"
        case .streamResponse(let waiter, let head, let relay): "stream(\(waiter), \(head.status.code), \(relay))"
        case .deliver(let relay, let part): "deliver(\(relay), \(String(buffer: part)))"
        case .respond(let waiter, let head, let body, let reusable):
            "respond(\(waiter), \(head.status.code), \(String(buffer: body)), \(reusable ? "reusable" : "closing"))"
        case .finishStream(let relay, let reusable, let read):
            "finish(\(relay), \(reusable ? "reusable" : "closing")\(read ? ", read" : ""))"
        case .switchProtocols(let waiter, let head): "switch(\(waiter), \(head.status.code))"
        case .fail(.ready(let error)): "fail(ready, \(error))"
        case .fail(.waiter(let waiter, let error)): "fail(\(waiter), \(error))"
        case .fail(.relay(let relay, let error)): "fail(\(relay), \(error))"
        case .fail(.connection): "fail(connection)"
        }
    }

    // MARK: Connecting

    @Test("without TLS the connection is ready once the channel is active, once")
    func readyWithoutTLS() {
        var machine = Machine(awaitsHandshake: false)
        #expect(machine.phase == .connecting)
        #expect(Self.describe(machine.handshakeCompleted()) == "none")
        #expect(Self.describe(machine.channelActive()) == "ready")
        #expect(machine.phase == .idle)
        #expect(Self.describe(machine.channelActive()) == "none")
    }

    @Test("with TLS the connection is ready at the handshake's end, not when TCP is up")
    func readyAfterHandshake() {
        var machine = Machine(awaitsHandshake: true)
        #expect(Self.describe(machine.channelActive()) == "none")
        #expect(machine.phase == .connecting)
        #expect(Self.describe(machine.handshakeCompleted()) == "ready")
        #expect(machine.phase == .idle)
    }

    @Test("a handshake not done in time fails the connect with the failure given")
    func handshakeTimeout() {
        var machine = Machine(awaitsHandshake: true)
        let limited = machine.limitHandshake(failure: .timeout)
        #expect(limited)
        #expect(Self.describe(machine.channelActive()) == "none")
        #expect(Self.describe(machine.timerFired()) == "fail(ready, timeout)")
        #expect(machine.phase == .closed(.flowing))
        #expect(Self.describe(machine.handshakeCompleted()) == "none")
    }

    @Test("once ready, the handshake's limit no longer applies")
    func handshakeLimitAfterReady() {
        var machine = Self.ready()
        let limited = machine.limitHandshake(failure: .connectTimeout)
        #expect(!limited)
        #expect(Self.describe(machine.timerFired()) == "none")
        #expect(machine.phase == .idle)
    }

    @Test("a connection closed during the handshake, or a connect that never came up, fails the connect")
    func closedWhileConnecting() {
        var closed = Machine(awaitsHandshake: true)
        #expect(Self.describe(closed.channelInactive()) == #"fail(ready, connectFailed("connection closed during the TLS handshake"))"#)
        var removed = Machine(awaitsHandshake: true)
        #expect(Self.describe(removed.handlerRemoved()) == #"fail(ready, connectFailed("connection closed"))"#)
        #expect(removed.phase == .closed(.flowing))
    }

    // MARK: Taking a request

    @Test("an idle, open connection takes a request and goes out with its deadline")
    func takesRequest() {
        var machine = Self.ready()
        #expect(Self.describe(machine.execute(Self.exchange(), deadline: nil, channelIsActive: true)) == "send(none)")
        #expect(machine.phase == .awaitingHead)
    }

    @Test("a connection that is connecting, busy, or no longer open refuses a request and stays as it was")
    func refusals() {
        let unusable = #"refuse(w2, connectionClosed("pooled connection no longer usable"))"#
        var connecting = Machine(awaitsHandshake: true)
        #expect(Self.describe(connecting.execute(Self.exchange("w2"), deadline: nil, channelIsActive: true)) == unusable)
        #expect(connecting.phase == .connecting)
        var busy = Self.sent()
        #expect(Self.describe(busy.execute(Self.exchange("w2"), deadline: nil, channelIsActive: true)) == unusable)
        #expect(busy.phase == .awaitingHead)
        var inactive = Self.ready()
        #expect(Self.describe(inactive.execute(Self.exchange("w2"), deadline: nil, channelIsActive: false)) == unusable)
        #expect(inactive.phase == .idle)
        var closed = Self.ready()
        #expect(Self.describe(closed.channelInactive()) == "none")
        #expect(closed.phase == .closed(.flowing))
        #expect(Self.describe(closed.execute(Self.exchange("w2"), deadline: nil, channelIsActive: true)) == unusable)
    }

    @Test("an error that closed an idle connection is the answer to the requests after it (the first error only)")
    func closedByAnswersLater() {
        var machine = Self.ready()
        #expect(Self.describe(machine.errorCaught(UpstreamError.tls("certificate required"), uncleanShutdown: false)) == "fail(connection)")
        #expect(Self.describe(machine.errorCaught(UpstreamError.protocolError("later"), uncleanShutdown: false)) == "fail(connection)")
        #expect(Self.describe(machine.execute(Self.exchange("w2"), deadline: nil, channelIsActive: true))
                == #"refuse(w2, tls("certificate required"))"#)
    }

    // MARK: Buffered responses

    @Test("a small declared body is collected whole and answered at its end; the connection is idle again")
    func bufferedResponse() {
        var machine = Self.sent()
        let relays = Relays()
        #expect(Self.describe(machine.receivedHead(Self.head(.ok, [("content-length", "5")]), openRelay: relays.open)) == "none")
        #expect(machine.phase == .buffering)
        #expect(Self.describe(machine.receivedBody(Self.buffer("he"))) == "none")
        #expect(Self.describe(machine.receivedBody(Self.buffer("llo"))) == "none")
        #expect(Self.describe(machine.receivedEnd(channelIsActive: true)) == "respond(w1, 200, hello, reusable)")
        #expect(machine.phase == .idle)
        #expect(relays.opened.isEmpty, "a small body must not stream")
        #expect(Self.describe(machine.execute(Self.exchange("w2"), deadline: nil, channelIsActive: true)) == "send(none)")
    }

    @Test("a response is reusable only with keep-alive on both sides and the connection still open",
          arguments: [(false, true, true), (true, false, true), (false, false, false)])
    func reusable(responseCloses: Bool, requestAsksClose: Bool, open: Bool) {
        var machine = Self.sent(Self.exchange(asksClose: requestAsksClose))
        let headers = [("content-length", "0")] + (responseCloses ? [("connection", "close")] : [])
        _ = machine.receivedHead(Self.head(.ok, headers), openRelay: Relays().open)
        #expect(Self.describe(machine.receivedEnd(channelIsActive: open)) == "respond(w1, 200, , closing)")
        #expect(machine.phase == .closed(.flowing))
    }

    @Test("without a relay, a large or undeclared body is collected whole, up to the limit")
    func noRelayBuffers() {
        var machine = Self.sent(Self.exchange(limit: 8))
        let relays = Relays()
        relays.streams = false
        #expect(Self.describe(machine.receivedHead(Self.head(.ok, [("transfer-encoding", "chunked")]), openRelay: relays.open)) == "none")
        #expect(machine.phase == .buffering)
        #expect(Self.describe(machine.receivedBody(Self.buffer("12345678"))) == "none")
        #expect(Self.describe(machine.receivedBody(Self.buffer("9"))) == "fail(w1, responseTooLarge(limit: 8))")
        #expect(machine.phase == .closed(.flowing))
    }

    @Test("a declared length over the limit fails at the head")
    func declaredTooLarge() {
        var machine = Self.sent(Self.exchange(limit: 100))
        let relays = Relays()
        #expect(Self.describe(machine.receivedHead(Self.head(.ok, [("content-length", "101")]), openRelay: relays.open))
                == "fail(w1, responseTooLarge(limit: 100))")
        #expect(relays.opened.isEmpty)
    }

    @Test("a response to HEAD, a 204 and a 304 have no body: buffered, whatever their length says",
          arguments: [(HTTPResponseStatus.ok, true), (.noContent, false), (.notModified, false)])
    func noBody(status: HTTPResponseStatus, requestIsHead: Bool) {
        var machine = Self.sent(Self.exchange(requestIsHead: requestIsHead))
        let relays = Relays()
        _ = machine.receivedHead(Self.head(status, [("content-length", "10000000")]), openRelay: relays.open)
        #expect(machine.phase == .buffering)
        #expect(relays.opened.isEmpty)
        #expect(Self.describe(machine.receivedEnd(channelIsActive: true)) == "respond(w1, \(status.code), , reusable)")
    }

    // MARK: Streamed responses

    @Test("a large declared body streams: the head is answered with the relay, which gets its length")
    func streamsDeclared() {
        var machine = Self.sent()
        let relays = Relays()
        #expect(Self.describe(machine.receivedHead(Self.head(.ok, [("content-length", "70000")]), openRelay: relays.open))
                == "stream(w1, 200, r1)")
        #expect(relays.opened == ["r1(w1, 70000)"])
        #expect(machine.phase == .streaming(.flowing))
    }

    @Test("an undeclared body streams; its parts go to the relay in order, and its end finishes it")
    func streamsUndeclared() {
        var machine = Self.sent()
        let relays = Relays()
        #expect(Self.describe(machine.receivedHead(Self.head(.ok, [("transfer-encoding", "chunked")]), openRelay: relays.open))
                == "stream(w1, 200, r1)")
        #expect(relays.opened == ["r1(w1, chunked)"])
        #expect(Self.describe(machine.receivedBody(Self.buffer("one"))) == "deliver(r1, one)")
        #expect(Self.describe(machine.receivedBody(Self.buffer("two"))) == "deliver(r1, two)")
        #expect(Self.describe(machine.receivedEnd(channelIsActive: true)) == "finish(r1, reusable)")
        #expect(machine.phase == .idle)
    }

    @Test("a streamed response that asked to close, or whose connection closed, is not reusable")
    func streamNotReusable() {
        var asked = Self.streaming(Self.exchange(asksClose: true))
        #expect(Self.describe(asked.receivedEnd(channelIsActive: true)) == "finish(r1, closing)")
        #expect(asked.phase == .closed(.flowing))
        var gone = Self.streaming()
        #expect(Self.describe(gone.receivedEnd(channelIsActive: false)) == "finish(r1, closing)")
    }

    // MARK: Backpressure

    @Test("a reader behind holds reads back; the read asked for meanwhile goes on, once, when it catches up")
    func backpressure() {
        var machine = Self.streaming()
        let passed1 = machine.read()
        #expect(passed1)
        machine.readerBehind()
        #expect(machine.phase == .streaming(.paused))
        let passed2 = machine.read()
        #expect(!passed2)
        #expect(machine.phase == .streaming(.pausedHoldingRead))
        let passed3 = machine.read()
        #expect(!passed3)
        #expect(Self.describe(machine.receivedBody(Self.buffer("already decoded"))) == "deliver(r1, already decoded)")
        #expect(Self.describe(machine.readerCaughtUp()) == "read")
        #expect(machine.phase == .streaming(.flowing))
        #expect(Self.describe(machine.readerCaughtUp()) == "none")
        let passed4 = machine.read()
        #expect(passed4)
    }

    @Test("a reader that catches up before a read was asked for has nothing to pass on")
    func caughtUpWithoutRead() {
        var machine = Self.streaming()
        machine.readerBehind()
        #expect(Self.describe(machine.readerCaughtUp()) == "none")
        #expect(machine.phase == .streaming(.flowing))
        let passed5 = machine.read()
        #expect(passed5)
    }

    @Test("the end of a body while reads are held passes the held read on; paused without one, nothing")
    func endWhilePaused() {
        var held = Self.streaming()
        held.readerBehind()
        _ = held.read()
        #expect(Self.describe(held.receivedEnd(channelIsActive: true)) == "finish(r1, reusable, read)")
        let passed6 = held.read()
        #expect(passed6, "reads flow again on the idle connection")
        var paused = Self.streaming()
        paused.readerBehind()
        #expect(Self.describe(paused.receivedEnd(channelIsActive: true)) == "finish(r1, reusable)")
        let passed7 = paused.read()
        #expect(passed7)
    }

    @Test("a late resume from an earlier exchange's reader changes nothing")
    func lateResume() {
        var machine = Self.streaming()
        machine.readerBehind()
        _ = machine.receivedEnd(channelIsActive: true)
        #expect(Self.describe(machine.readerCaughtUp()) == "none")
        #expect(Self.describe(machine.execute(Self.exchange("w2"), deadline: nil, channelIsActive: true)) == "send(none)")
        #expect(Self.describe(machine.readerCaughtUp()) == "none")
        #expect(machine.phase == .awaitingHead)
    }

    @Test("reads held when the exchange failed stay held, until the reader's resume lets them go")
    func heldReadsAfterFailure() {
        var machine = Self.streaming()
        machine.readerBehind()
        _ = machine.read()
        _ = machine.channelInactive()
        #expect(machine.phase == .closed(.pausedHoldingRead))
        let passed8 = machine.read()
        #expect(!passed8)
        #expect(Self.describe(machine.readerCaughtUp()) == "read")
        #expect(machine.phase == .closed(.flowing))
    }

    @Test("reads flow while connecting, idle, waiting for a head and collecting a body")
    func readsFlow() {
        var connecting = Machine(awaitsHandshake: true)
        let passed9 = connecting.read()
        #expect(passed9)
        var idle = Self.ready()
        let passed10 = idle.read()
        #expect(passed10)
        var waiting = Self.sent()
        let passed11 = waiting.read()
        #expect(passed11)
        _ = waiting.receivedHead(Self.head(.ok, [("content-length", "3")]), openRelay: Relays().open)
        let passed12 = waiting.read()
        #expect(passed12)
        waiting.readerBehind()
        #expect(waiting.phase == .buffering, "only a relay's reader pauses reads")
    }

    // MARK: Timeouts

    @Test("the deadline before the head, or before a buffered body's end, fails the exchange with timeout")
    func deadline() {
        var beforeHead = Self.sent()
        #expect(Self.describe(beforeHead.timerFired()) == "fail(w1, timeout)")
        #expect(beforeHead.phase == .closed(.flowing))
        var midBody = Self.sent()
        _ = midBody.receivedHead(Self.head(.ok, [("content-length", "10")]), openRelay: Relays().open)
        _ = midBody.receivedBody(Self.buffer("12345"))
        #expect(Self.describe(midBody.timerFired()) == "fail(w1, timeout)")
    }

    @Test("the deadline no longer applies once the body streams (its watchdog bounds it)")
    func deadlineStopsAtStreamedHead() {
        var machine = Self.streaming()
        #expect(Self.describe(machine.timerFired()) == "none")
        #expect(machine.phase == .streaming(.flowing))
        var idle = Self.ready()
        #expect(Self.describe(idle.timerFired()) == "none")
    }

    // MARK: The peer closing, errors

    @Test("the peer closing before the head: remote closed the connection")
    func closeBeforeHead() {
        var machine = Self.sent()
        #expect(Self.describe(machine.channelInactive()) == #"fail(w1, connectionClosed("remote closed the connection"))"#)
        #expect(machine.phase == .closed(.flowing))
        #expect(Self.describe(machine.channelInactive()) == "none", "told once")
    }

    @Test("the peer closing mid-body: the waiter of a buffered body, or the relay of a streamed one, hears it")
    func closeMidBody() {
        var buffered = Self.sent()
        _ = buffered.receivedHead(Self.head(.ok, [("content-length", "10")]), openRelay: Relays().open)
        _ = buffered.receivedBody(Self.buffer("12345"))
        #expect(Self.describe(buffered.channelInactive()) == #"fail(w1, connectionClosed("closed before the body was complete"))"#)
        var streamed = Self.streaming()
        _ = streamed.receivedBody(Self.buffer("12345"))
        #expect(Self.describe(streamed.channelInactive()) == #"fail(r1, connectionClosed("closed before the body was complete"))"#)
        #expect(Self.describe(streamed.handlerRemoved()) == "fail(connection)", "the relay is told once")
    }

    @Test("the peer closing an idle connection closes it quietly")
    func closeWhileIdle() {
        var machine = Self.ready()
        #expect(Self.describe(machine.channelInactive()) == "none")
        #expect(machine.phase == .closed(.flowing))
    }

    @Test("a transport error maps by where it struck: before the head a connect failure, after it a broken connection")
    func errorsMapByHead() {
        let reset = IOError(errnoCode: ECONNRESET, reason: "read")
        var beforeHead = Self.sent()
        #expect(Self.describe(beforeHead.errorCaught(reset, uncleanShutdown: false)).hasPrefix("fail(w1, connectFailed("))
        var afterHead = Self.sent()
        _ = afterHead.receivedHead(Self.head(.ok, [("content-length", "10")]), openRelay: Relays().open)
        #expect(Self.describe(afterHead.errorCaught(reset, uncleanShutdown: false)).hasPrefix("fail(w1, connectionClosed("))
    }

    @Test("TLS ending without close_notify is left to the decoder mid-exchange, and closes an idle connection")
    func uncleanShutdown() {
        struct Unclean: Error {}
        var exchanging = Self.sent()
        _ = exchanging.receivedHead(Self.head(.ok, [("content-length", "10")]), openRelay: Relays().open)
        #expect(Self.describe(exchanging.errorCaught(Unclean(), uncleanShutdown: true)) == "none")
        #expect(exchanging.phase == .buffering)
        var idle = Self.ready()
        #expect(Self.describe(idle.errorCaught(Unclean(), uncleanShutdown: true)) == "fail(connection)")
    }

    // MARK: Cancellation

    @Test("the relay's reader going away (cancellation) fails the relay and closes the connection")
    func readerGone() {
        var machine = Self.streaming()
        #expect(Self.describe(machine.failed(CancellationError())) == "fail(r1, CancellationError())")
        #expect(machine.phase == .closed(.flowing))
        #expect(Self.describe(machine.receivedBody(Self.buffer("late"))) == "close")
    }

    @Test("a cancelled exchange hears the cancellation as is, not as an upstream error")
    func cancelledWaiter() {
        var machine = Self.sent()
        #expect(Self.describe(machine.failed(CancellationError())) == "fail(w1, CancellationError())")
    }

    // MARK: Upgrades

    @Test("a 101 to an upgrade request stops the timer and holds reads; its end hands the connection over")
    func upgrade() {
        var machine = Self.sent(Self.exchange(asksClose: true, upgrade: true))
        #expect(Self.describe(machine.receivedHead(Self.head(.switchingProtocols), openRelay: Relays().open)) == "stopTimer")
        #expect(machine.phase == .switchingProtocols)
        let passed13 = machine.read()
        #expect(!passed13)
        #expect(Self.describe(machine.readerCaughtUp()) == "none", "only the tunnel lets reads go on")
        #expect(Self.describe(machine.timerFired()) == "none")
        #expect(Self.describe(machine.receivedEnd(channelIsActive: true)) == "switch(w1, 101)")
        #expect(machine.phase == .upgraded)
        let passed14 = machine.read()
        #expect(!passed14)
        #expect(Self.describe(machine.handlerRemoved()) == "none", "the tunnel owns the connection")
        #expect(Self.describe(machine.channelInactive()) == "none")
        #expect(machine.phase == .upgraded)
    }

    @Test("a 101 nobody asked for is a protocol error")
    func unaskedUpgrade() {
        var machine = Self.sent()
        #expect(Self.describe(machine.receivedHead(Self.head(.switchingProtocols), openRelay: Relays().open))
                == #"fail(w1, protocolError("101 Switching Protocols to a request that did not ask to upgrade"))"#)
    }

    @Test("the peer closing between a 101's head and its end fails the upgrade")
    func closeDuringUpgrade() {
        var machine = Self.sent(Self.exchange(upgrade: true))
        _ = machine.receivedHead(Self.head(.switchingProtocols), openRelay: Relays().open)
        #expect(Self.describe(machine.channelInactive()) == #"fail(w1, connectionClosed("closed before the body was complete"))"#)
    }

    // MARK: Bytes out of turn

    @Test("bytes no exchange asked for close the connection")
    func unsolicited() {
        var idle = Self.ready()
        #expect(Self.describe(idle.receivedHead(Self.head(), openRelay: Relays().open)) == "close")
        #expect(Self.describe(idle.receivedBody(Self.buffer("x"))) == "close")
        #expect(Self.describe(idle.receivedEnd(channelIsActive: true)) == "close")
    }

    @Test("a body or an end before any head, or a second head, is a protocol error")
    func outOfOrder() {
        var end = Self.sent()
        #expect(Self.describe(end.receivedEnd(channelIsActive: true)) == #"fail(w1, protocolError("no response head"))"#)
        var body = Self.sent()
        #expect(Self.describe(body.receivedBody(Self.buffer("x"))) == #"fail(w1, protocolError("no response head"))"#)
        var twice = Self.sent()
        _ = twice.receivedHead(Self.head(.ok, [("content-length", "1")]), openRelay: Relays().open)
        #expect(Self.describe(twice.receivedHead(Self.head(), openRelay: Relays().open)) == #"fail(w1, protocolError("a second response head"))"#)
    }

    @Test("after a failure, no event answers the waiter again")
    func answeredOnce() {
        var machine = Self.sent()
        #expect(Self.describe(machine.timerFired()) == "fail(w1, timeout)")
        let later = [machine.timerFired(), machine.channelInactive(), machine.errorCaught(UpstreamError.timeout, uncleanShutdown: false),
                     machine.receivedEnd(channelIsActive: true), machine.handlerRemoved()].map(Self.describe)
        #expect(later == ["none", "none", "fail(connection)", "close", "fail(connection)"])
    }
}
