import Foundation
import LockAudit
import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1
import PorticoTesting
import Testing
@testable import Portico

/// Issue #45, without a socket: when a request on a reused connection fails as a
/// `StaleConnection` (the exchange's machine and handler), and which of those the pool may send
/// again (`allowsResend`) on the slot of the stale one (`ConnectionPoolStateMachine.replace`).
@Suite("Stale connections: the decision")
struct StaleConnectionDecisionTests {
    typealias Machine = HTTP1ExchangeStateMachine<String, String>
    typealias Words = HTTP1ExchangeStateMachineTests

    /// A connection that has carried one exchange (answered whole, keep-alive) and is idle again.
    static func reused() -> Machine {
        var machine = Words.sent()
        #expect(Words.describe(machine.receivedHead(Words.head(.ok, [("content-length", "2")]), openRelay: { _, _ in nil })) == "none")
        #expect(Words.describe(machine.receivedBody(Words.buffer("ok"))) == "none")
        #expect(Words.describe(machine.receivedEnd(channelIsActive: true)) == "respond(w1, 200, ok, reusable)")
        #expect(machine.isReused && machine.phase == .idle)
        return machine
    }

    /// `reused()` with a second request written.
    static func resent() -> Machine {
        var machine = reused()
        #expect(Words.describe(machine.execute(Words.exchange("w2"), deadline: nil, channelIsActive: true)) == "send(none)")
        return machine
    }

    /// The waiter's failure in `action`.
    static func failure(_ action: Machine.Action) -> (any Error)? {
        if case .fail(.waiter(_, let error)) = action { error } else { nil }
    }

    static func stale(_ action: Machine.Action) -> StaleConnection? {
        failure(action) as? StaleConnection
    }

    static func refusal(_ start: Machine.Start) -> (any Error)? {
        if case .refuse(_, let error) = start { error } else { nil }
    }

    static let remoteClosed = UpstreamError.connectionClosed("remote closed the connection")
    static let reset = IOError(errnoCode: ECONNRESET, reason: "read(descriptor:pointer:size:)")

    // MARK: The exchange's machine

    @Test("a reused connection that ends before any byte of the response: stale after the write, by EOF or by reset")
    func endsAfterWrite() {
        var closed = Self.resent()
        #expect(Self.stale(closed.channelInactive()) == StaleConnection(moment: .afterWrite, failure: Self.remoteClosed))
        #expect(closed.phase == .closed(.flowing))
        var reset = Self.resent()
        #expect(Self.stale(reset.errorCaught(Self.reset, uncleanShutdown: false))
                == StaleConnection(moment: .afterWrite, failure: .connectFailed("connection reset by peer")))
        var brokenPipe = Self.resent()
        #expect(Self.stale(brokenPipe.failed(IOError(errnoCode: EPIPE, reason: "writev")))?.moment == .afterWrite)
    }

    @Test("a new connection's first request is never stale: nothing was reused")
    func newConnectionNeverStale() {
        var machine = Self.ready()
        #expect(!machine.isReused)
        #expect(Words.describe(machine.execute(Words.exchange(), deadline: nil, channelIsActive: true)) == "send(none)")
        let action = machine.channelInactive()
        #expect(Self.stale(action) == nil)
        #expect(Self.failure(action) as? UpstreamError == Self.remoteClosed)
        var refused = Self.ready()
        #expect(Self.refusal(refused.execute(Words.exchange(), deadline: nil, channelIsActive: true, peerHasClosed: true))
                as? UpstreamError == .connectionClosed("pooled connection no longer usable"))
    }

    static func ready() -> Machine { Words.ready() }

    @Test("once the response has begun, or failed for a reason other than the connection ending, it is not stale")
    func notStale() {
        var afterHead = Self.resent()
        _ = afterHead.receivedHead(Words.head(.ok, [("content-length", "10")]), openRelay: { _, _ in nil })
        #expect(Self.failure(afterHead.channelInactive()) as? UpstreamError == .connectionClosed("closed before the body was complete"))
        // Part of a head, then EOF: the decoder's error says bytes came.
        var partialHead = Self.resent()
        #expect(Self.failure(partialHead.errorCaught(HTTPParserError.invalidEOFState, uncleanShutdown: false))
                as? UpstreamError == .connectionClosed("closed before the body was complete"))
        var timedOut = Self.resent()
        #expect(Self.failure(timedOut.timerFired()) as? UpstreamError == .timeout)
        var garbage = Self.resent()
        #expect(Self.stale(garbage.errorCaught(HTTPParserError.invalidVersion, uncleanShutdown: false)) == nil)
        var cancelled = Self.resent()
        #expect(Self.failure(cancelled.failed(CancellationError())) is CancellationError)
    }

    @Test("a reused connection found closed before the write refuses the request as stale before the write, and stays as it was")
    func closedBeforeWrite() {
        let unusable = StaleConnection(moment: .beforeWrite, failure: .connectionClosed("pooled connection no longer usable"))
        var peerClosed = Self.reused()
        #expect(Self.refusal(peerClosed.execute(Words.exchange("w2"), deadline: nil, channelIsActive: true, peerHasClosed: true))
                as? StaleConnection == unusable)
        #expect(peerClosed.phase == .idle)
        var inactive = Self.reused()
        #expect(Self.refusal(inactive.execute(Words.exchange("w2"), deadline: nil, channelIsActive: false)) as? StaleConnection == unusable)
        // Closed while idle by a reset: the reason is the failure, the moment still before the write.
        var resetWhileIdle = Self.reused()
        #expect(Words.describe(resetWhileIdle.errorCaught(Self.reset, uncleanShutdown: false)) == "fail(connection)")
        #expect(Self.refusal(resetWhileIdle.execute(Words.exchange("w2"), deadline: nil, channelIsActive: true)) as? StaleConnection
                == StaleConnection(moment: .beforeWrite, failure: .connectFailed("connection reset by peer")))
        // A busy connection refuses as before: that is no stale connection but a second request at once.
        var busy = Self.resent()
        #expect(Self.refusal(busy.execute(Words.exchange("w3"), deadline: nil, channelIsActive: true)) is UpstreamError)
    }

    // MARK: Which may go out again

    static func exchange(_ method: HTTPMethod, streamed: Bool = false) -> HTTP1Exchange {
        let context = RequestContext(requestID: "stale", route: "test", upstream: "test", deadline: .now + .seconds(60),
                                     logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }), clock: ManualClock())
        return HTTP1Exchange(head: HTTPRequestHead(version: .http1_1, method: method, uri: "/"), body: nil,
                             upload: streamed ? UpstreamUpload(Body(bytes: Array("x".utf8)), context: context) : nil,
                             limit: 1 << 20, requestIsHead: method == .HEAD, makeRelay: nil)
    }

    @Test("before the write any request goes out again; after it only an idempotent one with a buffered body",
          arguments: [HTTPMethod.GET, .HEAD, .OPTIONS, .TRACE, .PUT, .DELETE, .POST, .PATCH, .CONNECT])
    func resendRule(method: HTTPMethod) {
        let idempotent = [HTTPMethod.GET, .HEAD, .OPTIONS, .TRACE, .PUT, .DELETE].contains(method)
        let before = StaleConnection(moment: .beforeWrite, failure: Self.remoteClosed)
        let after = StaleConnection(moment: .afterWrite, failure: Self.remoteClosed)
        #expect(before.allowsResend(of: Self.exchange(method)))
        #expect(before.allowsResend(of: Self.exchange(method, streamed: true)), "refused unsent: the body is untouched")
        #expect(after.allowsResend(of: Self.exchange(method)) == idempotent)
        #expect(!after.allowsResend(of: Self.exchange(method, streamed: true)), "a streamed body was consumed as it went")
    }

    // MARK: The pool's slot

    struct Conn: PoolableConnection {
        var id: Int
        var isActive = true
    }

    @Test("a stale connection's slot passes to the connection opened for the resend: no wait at the cap, no idle one taken")
    func slotPassesOn() {
        let cap = SharedCap(name: "test.stale")
        var machine = ConnectionPoolStateMachine<Conn, String>(cap: cap, limit: 1, idleTimeout: .seconds(60))
        let now = NIODeadline.uptimeNanoseconds(1_000_000_000)
        guard case .connect = machine.lease(now: now).0 else { Issue.record("the first lease connects"); return }
        // (Transitions are mutating: their results are named before `#expect` looks at them.)
        let kept = machine.connected(Conn(id: 1))
        let replaced = machine.replace(Conn(id: 1))
        #expect(kept && replaced)
        #expect(machine.connectionCount == 1 && cap.current == 1, "the slot is held for the new connection")
        let opened = machine.connected(Conn(id: 2))
        let released = machine.release(Conn(id: 2), reusable: true, now: now)
        #expect(opened && released.close.isEmpty)
        #expect(machine.idleCount == 1 && cap.current == 1)
        let again = machine.replace(Conn(id: 1))
        #expect(!again, "no longer the pool's")
        _ = machine.shutdown()
        let afterShutdown = machine.replace(Conn(id: 2))
        #expect(!afterShutdown, "shut down: the slot went back with it")
        #expect(cap.current == 0)
    }

    // MARK: The handler

    @Test("on a reused connection the kernel is asked before a POST, which is refused unsent when the server has closed")
    func handlerAsksBeforeUnsafeRequest() throws {
        var asked = 0
        var closed = false
        let connection = try HTTP1ExchangeHandlerTests.Connection(peerHasClosed: { _ in asked += 1; return closed })
        let post = HTTP1Exchange(head: HTTPRequestHead(version: .http1_1, method: .POST, uri: "/p", headers: ["content-length": "1"]),
                                 body: ByteBuffer(string: "x"), limit: 1 << 20, requestIsHead: false)
        // A new connection: nothing to ask.
        let first = connection.execute(post)
        #expect(asked == 0)
        #expect(try connection.written().hasPrefix("POST /p HTTP/1.1\r\n"))
        try connection.receive("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        #expect(first.response?.reusable == true)
        // Reused, a GET: not asked (it may go out again once written).
        let get = connection.execute(HTTP1ExchangeHandlerTests.get())
        #expect(asked == 0)
        _ = try connection.written()
        try connection.receive("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        #expect(get.response != nil)
        // Reused, a POST, the server gone: refused, not a byte written.
        closed = true
        let refused = connection.execute(post)
        #expect(asked == 1)
        #expect(try connection.written() == "")
        #expect(refused.error as? StaleConnection
                == StaleConnection(moment: .beforeWrite, failure: .connectionClosed("pooled connection no longer usable")))
    }

    @Test("a reused connection closed under a written request fails it as stale after the write; a new one does not")
    func handlerEndsAfterWrite() throws {
        let connection = try HTTP1ExchangeHandlerTests.Connection()
        let first = connection.execute(HTTP1ExchangeHandlerTests.get())
        _ = try connection.written()
        try connection.receive("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        #expect(first.response?.reusable == true)
        let second = connection.execute(HTTP1ExchangeHandlerTests.get("/b"))
        #expect(try connection.written().hasPrefix("GET /b HTTP/1.1\r\n"))
        try connection.channel.close().wait()
        #expect(second.error as? StaleConnection == StaleConnection(moment: .afterWrite, failure: Self.remoteClosed))

        let fresh = try HTTP1ExchangeHandlerTests.Connection()
        let only = fresh.execute(HTTP1ExchangeHandlerTests.get())
        _ = try fresh.written()
        fresh.channel.pipeline.fireErrorCaught(Self.reset)
        #expect(only.error as? UpstreamError == .connectFailed("connection reset by peer"))
    }
}
