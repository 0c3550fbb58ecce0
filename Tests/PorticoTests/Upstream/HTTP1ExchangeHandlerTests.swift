import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1
import NIOTLS
import PorticoTesting
import Testing
@testable import Portico

/// `HTTP1ExchangeHandler` in the pipeline an `HTTP1Connection` builds (NIO's HTTP/1 client codecs
/// before it), on an `EmbeddedChannel`: requests read back as bytes, responses written in as
/// bytes, time moved by hand. Reads that reach the socket's end are counted (`ReadCounter`).
@Suite("HTTP/1 exchange handler")
struct HTTP1ExchangeHandlerTests {
    /// Counts the reads asked of the socket: the ones the exchange handler let through.
    final class ReadCounter: ChannelOutboundHandler {
        typealias OutboundIn = IOData
        var reads = 0
        func read(context: ChannelHandlerContext) {
            reads += 1
            context.read()
        }
    }

    /// What a completion heard.
    final class Answer {
        var result: Result<HTTP1Response, any Error>?
        var response: HTTP1Response? { try? result?.get() }
        var error: (any Error)? {
            if case .failure(let error)? = result { error } else { nil }
        }
    }

    struct Connection {
        let channel = EmbeddedChannel()
        let reads = ReadCounter()
        let handler: HTTP1ExchangeHandler

        /// Built and connected; with `tls` it is ready at the handshake's end. `peerHasClosed`
        /// stands in for the kernel's word on a reused connection (`PeerLiveness`).
        init(tls: Bool = false, handshakeLimit: TimeAmount? = nil, peerHasClosed: ((any Channel) -> Bool)? = nil) throws {
            handler = HTTP1ExchangeHandler(ready: channel.eventLoop.makePromise(), awaitsHandshake: tls,
                                           peerHasClosed: peerHasClosed)
            if let handshakeLimit {
                handler.limitHandshake(to: handshakeLimit, on: channel.eventLoop, failure: .connectTimeout)
            }
            let pipeline = channel.pipeline.syncOperations
            try pipeline.addHandler(reads)
            try pipeline.addHTTPClientHandlers(leftOverBytesStrategy: .forwardBytes, enableOutboundHeaderValidation: false)
            try pipeline.addHandler(handler)
            channel.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 8080), promise: nil)
        }

        var readyResult: Result<Void, any Error>? {
            var result: Result<Void, any Error>?
            handler.ready.assumeIsolated().whenComplete { result = $0 }  // at once on an embedded loop, when complete
            return result
        }

        /// Sends `exchange`; the answer, once it comes, is in the returned `Answer`.
        func execute(_ exchange: HTTP1Exchange) -> Answer {
            let answer = Answer()
            handler.execute(exchange) { answer.result = $0 }
            return answer
        }

        /// Everything written toward the upstream so far, as text.
        func written() throws -> String {
            var text = ""
            while let part = try channel.readOutbound(as: IOData.self) {
                if case .byteBuffer(let buffer) = part { text += String(buffer: buffer) }
            }
            return text
        }

        func receive(_ text: String) throws {
            try channel.writeInbound(ByteBuffer(string: text))
        }

        func receive(_ bytes: Int) throws {
            try channel.writeInbound(ByteBuffer(repeating: UInt8(ascii: "x"), count: bytes))
        }
    }

    static func get(_ path: String = "/a", deadline: NIODeadline? = nil, upgrade: Bool = false,
                    makeRelay: HTTP1Exchange.RelayFactory? = nil) -> HTTP1Exchange {
        var headers: HTTPHeaders = ["host": "upstream.test"]
        if upgrade { headers.add(contentsOf: [("connection", "upgrade"), ("upgrade", "websocket")]) }
        return HTTP1Exchange(head: HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: headers),
                             limit: 1 << 24, deadline: deadline, requestIsHead: false, upgrade: upgrade, makeRelay: makeRelay)
    }

    /// A relay as the `nio` transport makes one, on a clock that never moves (its watchdog stays quiet).
    static let relay: HTTP1Exchange.RelayFactory = { length, cancel in
        let context = RequestContext(requestID: "embedded", route: "test", upstream: "test", deadline: .now + .seconds(60),
                                     logger: Logger(label: "portico.tests.exchange", factory: { _ in SwiftLogNoOpLogHandler() }),
                                     clock: ManualClock())
        return StreamedResponseRelay(length: length, limit: 1 << 24, upstream: "test", context: context, cancel: cancel)
    }

    /// Reads what is queued in `stream` without waiting: its text length, and how the poll ended.
    static func drain(_ stream: BodyStream) -> (bytes: Int, ending: String) {
        var bytes = 0
        while true {
            switch stream.poll(wake: {}) {
            case .chunk(let chunk): bytes += chunk.readableBytes
            case .pending: return (bytes, "pending")
            case .end: return (bytes, "end")
            case .failed(let error): return (bytes, "failed(\(error.kind))")
            }
        }
    }

    // MARK: Tests

    @Test("a request is written whole, its response read whole, and the connection carries the next one")
    func bufferedExchange() throws {
        let connection = try Connection()
        #expect(connection.readyResult.map { (try? $0.get()) != nil } == true)
        let first = connection.execute(Self.get("/a"))
        let request = try connection.written()
        #expect(request.hasPrefix("GET /a HTTP/1.1\r\n"))
        #expect(request.contains("host: upstream.test\r\n"))
        #expect(first.result == nil, "no answer before the response")
        try connection.receive("HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx-a: 1\r\n\r\nhel")
        #expect(first.result == nil, "no answer before the body's end")
        try connection.receive("lo")
        let response = try #require(first.response)
        #expect(response.head.status == .ok && response.head.headers["x-a"] == ["1"])
        #expect(String(buffer: response.body) == "hello")
        #expect(response.reusable && response.stream == nil)
        let second = connection.execute(Self.get("/b"))
        #expect(try connection.written().hasPrefix("GET /b HTTP/1.1\r\n"))
        try connection.receive("HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
        #expect(second.response?.head.status == .noContent)
        #expect(second.response?.reusable == false)
        #expect(!connection.channel.isActive, "a response that closes closes the connection")
    }

    @Test("a large body streams from its head; a reader behind holds reads back until it catches up")
    func streamingWithBackpressure() throws {
        let connection = try Connection()
        let answer = connection.execute(Self.get(makeRelay: Self.relay))
        _ = try connection.written()
        let total = 600 * 1024 + 1
        try connection.receive("HTTP/1.1 200 OK\r\ncontent-length: \(total)\r\n\r\n")
        let response = try #require(answer.response, "answered at the head")
        let stream = try #require(response.stream)
        #expect(stream.length == total)
        var finished: Bool?
        response.finished?.assumeIsolated().whenSuccess { finished = $0 }

        // Past the stream's high water (256 KiB) the reader is behind: a read asked for is held.
        try connection.receive(300 * 1024)
        let before = connection.reads.reads
        connection.channel.read()
        #expect(connection.reads.reads == before, "the read must wait for the reader")

        // The reader takes the queue down; its resume, on the loop, lets the held read go.
        #expect(Self.drain(stream) == (300 * 1024, "pending"))
        #expect(connection.reads.reads == before)
        connection.channel.embeddedEventLoop.run()
        #expect(connection.reads.reads == before + 1)
        connection.channel.read()
        #expect(connection.reads.reads == before + 2, "reads flow again")

        // Behind again, a read held: the body's end lets it go (the connection is free again)
        // before the reader has caught up.
        try connection.receive(300 * 1024)
        connection.channel.read()
        #expect(connection.reads.reads == before + 2)
        try connection.receive(1)
        #expect(connection.reads.reads == before + 3)
        #expect(finished == true, "the connection may carry another request")
        #expect(Self.drain(stream) == (300 * 1024 + 1, "end"))
        #expect(connection.channel.isActive)
    }

    @Test("the peer closing mid-body fails a buffered exchange with upstream_connection_closed")
    func closeMidBufferedBody() throws {
        let connection = try Connection()
        let answer = connection.execute(Self.get())
        try connection.receive("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n12345")
        try connection.channel.close().wait()
        let error = try #require(answer.error as? UpstreamError)
        #expect(error == .connectionClosed("closed before the body was complete"))
        #expect(error.gatewayError(upstream: "test").kind == .upstreamConnectionClosed)
    }

    @Test("the peer closing mid-body of a streamed response fails the stream after the bytes before it")
    func closeMidStreamedBody() throws {
        let connection = try Connection()
        let answer = connection.execute(Self.get(makeRelay: Self.relay))
        try connection.receive("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        let response = try #require(answer.response)
        let stream = try #require(response.stream)
        var finished: Bool?
        response.finished?.assumeIsolated().whenSuccess { finished = $0 }
        try connection.channel.close().wait()
        #expect(Self.drain(stream) == (5, "failed(upstream_connection_closed)"))
        #expect(finished == false, "a connection cut short is not reused")
    }

    @Test("the peer closing before the head fails the exchange as a closed connection")
    func closeBeforeHead() throws {
        let connection = try Connection()
        let answer = connection.execute(Self.get())
        try connection.channel.close().wait()
        #expect(answer.error as? UpstreamError == .connectionClosed("remote closed the connection"))
        let late = connection.execute(Self.get())
        #expect(late.error as? UpstreamError == .connectionClosed("pooled connection no longer usable"))
    }

    @Test("the exchange's deadline fails it with timeout and closes the connection; an answer in time stops it")
    func deadline() throws {
        let connection = try Connection()
        let loop = connection.channel.embeddedEventLoop
        let answered = connection.execute(Self.get(deadline: loop.now + .seconds(2)))
        try connection.receive("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        let late = connection.execute(Self.get(deadline: loop.now + .seconds(3)))
        loop.advanceTime(by: .seconds(2))
        #expect(answered.response?.reusable == true)
        #expect(late.result == nil, "the first exchange's timer must not fire for the second")
        loop.advanceTime(by: .seconds(1))
        #expect(late.error as? UpstreamError == .timeout)
        #expect(!connection.channel.isActive)
    }

    @Test("with TLS, ready at the handshake's end; a handshake not done in time fails the connect and closes")
    func handshake() throws {
        let done = try Connection(tls: true, handshakeLimit: .seconds(5))
        #expect(done.readyResult == nil, "TCP alone is not ready")
        done.channel.pipeline.fireUserInboundEventTriggered(TLSUserEvent.handshakeCompleted(negotiatedProtocol: nil))
        #expect(done.readyResult.map { (try? $0.get()) != nil } == true)
        let answer = done.execute(Self.get())
        done.channel.embeddedEventLoop.advanceTime(by: .seconds(10))
        #expect(answer.result == nil, "the handshake's limit must not cut the exchange after it")
        #expect(done.channel.isActive)

        let stuck = try Connection(tls: true, handshakeLimit: .seconds(5))
        stuck.channel.embeddedEventLoop.advanceTime(by: .seconds(5))
        let failure: (any Error)? = if case .failure(let error)? = stuck.readyResult { error } else { nil }
        #expect(failure as? UpstreamError == .connectTimeout)
        #expect(!stuck.channel.isActive)
    }

    @Test("a 101 to an upgrade request hands the connection to a tunnel with the bytes after the head")
    func upgrade() throws {
        let connection = try Connection()
        let answer = connection.execute(Self.get(upgrade: true))
        #expect(try connection.written().contains("upgrade: websocket\r\n"))
        try connection.receive("HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\nframe")
        #expect(answer.result == nil, "handed over on the next turn, outside the decoder's read")
        connection.channel.embeddedEventLoop.run()
        let tunnel = try #require(answer.response?.tunnel)
        #expect(answer.response?.head.status == .switchingProtocols)
        #expect(tunnel.relay.value.bytesRead == 5, "the bytes the decoder read past the head reach the tunnel")
        #expect(throws: (any Error).self) { try connection.channel.pipeline.syncOperations.handler(type: HTTP1ExchangeHandler.self) }
    }

    @Test("a 101 nobody asked for fails the exchange as a protocol error")
    func unaskedUpgrade() throws {
        let connection = try Connection()
        let answer = connection.execute(Self.get())
        try connection.receive("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n")
        #expect(answer.error as? UpstreamError == .protocolError("101 Switching Protocols to a request that did not ask to upgrade"))
        #expect(!connection.channel.isActive)
    }
}
