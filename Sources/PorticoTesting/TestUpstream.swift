import Foundation
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import Portico
import Synchronization

/// An in-process HTTP/1.1 or HTTP/2 upstream on SwiftNIO for tests and `portico demo`, bound to
/// 127.0.0.1 on an ephemeral port.
///
/// With `speaking: .http2` it serves HTTP/2 only: by prior knowledge (h2c) over cleartext, with
/// ALPN `h2` over TLS. Each stream is turned into HTTP/1-shaped parts
/// (`HTTP2FramePayloadToHTTP1ServerCodec`), so the same routes serve both; `arrivals` tells on
/// which protocol and connection each request came, and `peakStreams` whether streams shared one.
///
/// Responses are scripted per path (exact path, query ignored) or by a fallback closure; the
/// default fallback echoes the request. Responses are written as raw bytes, so duplicate
/// headers, lying `Content-Length`s and abrupt closes are all possible.
///
/// ```swift
/// let upstream = TestUpstream()
/// upstream.route("/slow") { _ in try await Task.sleep(for: .seconds(1)); return .text("late") }
/// upstream.route("/gone", .redirect(301, location: "/new"))
/// try await upstream.start()
/// defer { Task { await upstream.shutdown() } }
/// ```
public final class TestUpstream: Sendable {
    public typealias Handler = @Sendable (Request) async throws -> Response

    /// The protocol it serves.
    public enum Speaks: String, Sendable, CaseIterable {
        case http1
        /// HTTP/2 only: prior knowledge (h2c) in cleartext, ALPN `h2` over TLS.
        case http2
    }

    /// Where and how a request arrived.
    public struct Arrival: Sendable, Equatable {
        public var path: String
        /// `HTTP/1.1`, `HTTP/2.0`.
        public var version: String
        /// 1, 2, … in order of accepting.
        public var connection: Int
    }

    private typealias HTTP1Connection = NIOAsyncChannel<HTTPServerRequestPart, ByteBuffer>
    private typealias Stream = NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>
    /// A stream, closed properly if the connection ends before it is served.
    private typealias AcceptedStream = LoopbackServer<Stream>.Accepted

    /// An HTTP/2 connection: the streams the client opens arrive on `streams`.
    private struct HTTP2Connection: LoopbackConnection {
        let channel: any Channel
        let streams: NIOHTTP2Handler.AsyncStreamMultiplexer<AcceptedStream>
        func closeUnserved() async {
            try? await channel.close()
        }
    }

    private enum Served: LoopbackConnection {
        case http1(HTTP1Connection)
        case http2(HTTP2Connection)

        var channel: any Channel {
            switch self {
            case .http1(let connection): connection.channel
            case .http2(let connection): connection.channel
            }
        }

        func closeUnserved() async {
            switch self {
            case .http1(let connection): await connection.closeUnserved()
            case .http2(let connection): await connection.closeUnserved()
            }
        }
    }

    private let loopback = LoopbackServer<Served>()
    /// Arrivals kept (tests send far fewer; the rest are counted in `hits` only).
    private static let maxArrivals = 100_000

    private struct State {
        var routes: [String: Handler] = [:]
        var hits: [String: Int] = [:]
        var port: Int = 0
        var accepted = 0
        var open = 0
        var abandoned = 0
        var arrivals: [Arrival] = []
        /// HTTP/2: streams open now per connection, and the most seen at once on one.
        var streams: [Int: Int] = [:]
        var peakStreams = 0
    }

    private let fallback: Handler
    private let tls: TLSConfiguration?
    public let speaks: Speaks
    /// The loopback address it binds (Linux routes all of 127/8: tests run several upstreams on
    /// 127.0.0.1, 127.0.0.2, 127.0.0.3).
    public let host: String
    private let state = Mutex(State())

    /// `handler` answers paths without a route (default: echo). With `tls` it serves HTTPS;
    /// `speaking: .http2` serves HTTP/2 (h2c, or ALPN `h2` with `tls`).
    public init(handler: Handler? = nil, tls: TLSConfiguration? = nil, host: String = "127.0.0.1",
                speaking: Speaks = .http1) {
        fallback = handler ?? { .echo($0) }
        var tls = tls
        if speaking == .http2 { tls?.applicationProtocols = ["h2"] }
        self.tls = tls
        self.host = host
        speaks = speaking
    }

    /// Scripts `path` with a closure (it may await: delays, gates).
    public func route(_ path: String, _ handler: @escaping Handler) {
        state.withLock { $0.routes[path] = handler }
    }

    /// Scripts `path` with a fixed response.
    public func route(_ path: String, _ response: Response) {
        route(path) { _ in response }
    }

    /// Requests received for `path` (query ignored).
    public func hits(_ path: String) -> Int {
        state.withLock { $0.hits[path] ?? 0 }
    }

    public var totalHits: Int { state.withLock { $0.hits.values.reduce(0, +) } }

    /// Connections accepted so far, and those still open (a client's pool reusing or dropping them).
    public var connections: (accepted: Int, open: Int) { state.withLock { ($0.accepted, $0.open) } }

    /// Requests answered `untilClientCloses` whose client has closed the connection.
    public var abandoned: Int { state.withLock { $0.abandoned } }

    /// Every request so far (up to 100 000), in order of arrival: path, protocol, connection.
    public var arrivals: [Arrival] { state.withLock { $0.arrivals } }

    /// HTTP/2: the most streams open at once on one connection (0 on HTTP/1.1). Above 1, requests
    /// were multiplexed.
    public var peakStreams: Int { state.withLock { $0.peakStreams } }

    /// The bound port (0 before `start()`).
    public var port: Int { state.withLock { $0.port } }

    /// `http://HOST:PORT`, or `https://` when serving TLS.
    public var baseURL: URL { URL(string: "\(tls == nil ? "http" : "https")://\(host):\(port)")! }

    /// Binds `port` (0: an ephemeral one), e.g. the port of an upstream stopped earlier, to restart it.
    public func start(port: Int = 0) async throws {
        let sslContext = try tls.map { try NIOSSLContext(configuration: $0) }
        let speaks = speaks
        let server: LoopbackServer<Served>.Server = try await ServerBootstrap(group: TestExecutors.group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .bind(host: host, port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext))
                    }
                    guard speaks == .http2 else {
                        try channel.pipeline.syncOperations.addHandler(
                            ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes)))
                        return .init(.http1(try HTTP1Connection(wrappingChannelSynchronously: channel)))
                    }
                    let streams = try channel.pipeline.syncOperations.configureAsyncHTTP2Pipeline(mode: .server) { stream in
                        stream.eventLoop.makeCompletedFuture {
                            try stream.pipeline.syncOperations.addHandler(HTTP2FramePayloadToHTTP1ServerCodec())
                            return AcceptedStream(try Stream(wrappingChannelSynchronously: stream))
                        }
                    }
                    return .init(.http2(HTTP2Connection(channel: channel, streams: streams)))
                }
            }
        let port = loopback.run(server) { [self] connection in
            switch connection {
            case .http1(let connection): await serve(connection)
            case .http2(let connection): await serve(connection)
            }
        }
        state.withLock { $0.port = port }
    }

    /// Closes the listener and every connection, including ones waiting in `never`.
    public func shutdown() async {
        await loopback.shutdown()
    }

    private func serve(_ connection: HTTP1Connection) async {
        let id = state.withLock { $0.accepted += 1; $0.open += 1; return $0.accepted }
        defer { state.withLock { $0.open -= 1 } }
        let channel = connection.channel
        try? await connection.executeThenClose { inbound, outbound in
            var head: HTTPRequestHead?
            var body: [UInt8] = []
            for try await part in inbound {
                switch part {
                case .head(let h):
                    head = h
                    body = []
                case .body(let buffer):
                    body.append(contentsOf: buffer.readableBytesView)
                case .end:
                    guard let h = head else { continue }
                    head = nil
                    let request = Request(method: h.method.rawValue, target: h.uri,
                                          version: "HTTP/\(h.version.major).\(h.version.minor)",
                                          headers: h.headers.map { ($0.name, $0.value) }, body: body, connection: id)
                    let response = await answer(request)
                    if let delay = response.delay { try await Task.sleep(for: delay) }
                    if case .never = response.ending {
                        while true { try await Task.sleep(for: .seconds(3600)) }
                    }
                    if case .untilClientCloses = response.ending {
                        try? await channel.closeFuture.get()
                        state.withLock { $0.abandoned += 1 }
                        return
                    }
                    try await outbound.write(Self.serialize(response, for: request))
                    if case .closeAfterBody = response.ending { return }
                    if case .streamed(let pieces, let end) = response.ending {
                        let chunked = !Self.declaresLength(response)
                        for await piece in pieces where !piece.isEmpty {
                            var out = ByteBuffer()
                            if chunked { out.writeString(String(piece.count, radix: 16) + "\r\n") }
                            out.writeBytes(piece)
                            if chunked { out.writeString("\r\n") }
                            try await outbound.write(out)
                        }
                        guard case .complete = end else { return }
                        if chunked { try await outbound.write(ByteBuffer(string: "0\r\n\r\n")) }
                    }
                    if !h.isKeepAlive { return }
                }
            }
        }
    }

    /// Serves the streams of one HTTP/2 connection, each in its own task, until the connection
    /// ends (or `shutdown`); then the streams still waiting (`never`) are cancelled.
    private func serve(_ connection: HTTP2Connection) async {
        let id = state.withLock { $0.accepted += 1; $0.open += 1; return $0.accepted }
        defer { state.withLock { $0.open -= 1; $0.streams[id] = nil } }
        await withDiscardingTaskGroup { group in
            do {
                for try await accepted in connection.streams.inbound {
                    group.addTask(executorPreference: accepted.executor) { [self] in
                        if let stream = accepted.take() { await serve(stream, on: id) }
                    }
                }
            } catch {}
            group.cancelAll()
        }
        try? await connection.channel.close()
    }

    /// One HTTP/2 stream: one request, one response. Parts are written straight to the stream's
    /// channel and each write awaited: it completes once the frame went out, so a body waits on
    /// the stream's flow-control window, and nothing is still queued when the stream is closed.
    private func serve(_ stream: Stream, on connection: Int) async {
        state.withLock { state in
            state.streams[connection, default: 0] += 1
            state.peakStreams = max(state.peakStreams, state.streams[connection] ?? 0)
        }
        defer { state.withLock { $0.streams[connection]? -= 1 } }
        let channel = stream.channel
        try? await stream.executeThenClose { inbound, _ in
            var head: HTTPRequestHead?
            var body: [UInt8] = []
            for try await part in inbound {
                switch part {
                case .head(let h): head = h
                case .body(let buffer): body.append(contentsOf: buffer.readableBytesView)
                case .end: break
                }
                guard case .end = part else { continue }
                guard let h = head else { return }
                let request = Request(method: h.method.rawValue, target: h.uri,
                                      version: "HTTP/\(h.version.major).\(h.version.minor)",
                                      headers: h.headers.map { ($0.name, $0.value) }, body: body, connection: connection)
                let response = await answer(request)
                if let delay = response.delay { try await Task.sleep(for: delay) }
                switch response.ending {
                case .never:
                    while true { try await Task.sleep(for: .seconds(3600)) }
                case .untilClientCloses:
                    // A stream's channel closes when the client resets it (or the connection ends).
                    try? await channel.closeFuture.get()
                    state.withLock { $0.abandoned += 1 }
                    return
                case .complete, .closeAfterBody, .streamed:
                    break
                }
                try await channel.writeAndFlush(HTTPServerResponsePart.head(Self.head(response))).get()
                let bodiless = response.status < 200 || response.status == 204 || response.status == 304
                if request.method != "HEAD" && !bodiless && !response.body.isEmpty {
                    try await channel.writeAndFlush(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(bytes: response.body)))).get()
                }
                switch response.ending {
                case .closeAfterBody:
                    return  // closed before its end: RST_STREAM
                case .streamed(let pieces, let end):
                    for await piece in pieces where !piece.isEmpty {
                        try await channel.writeAndFlush(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(bytes: piece)))).get()
                    }
                    guard case .complete = end else { return }
                default:
                    break
                }
                try await channel.writeAndFlush(HTTPServerResponsePart.end(nil)).get()
                return
            }
        }
    }

    /// The response head for HTTP/2 (the codec drops connection-specific fields; a `Content-Length`
    /// is added as on HTTP/1.1).
    private static func head(_ response: Response) -> HTTPResponseHead {
        var headers = HTTPHeaders(response.headers.map { ($0.name, $0.value) })
        let bodiless = response.status < 200 || response.status == 204 || response.status == 304
        if case .closeAfterBody(let declared) = response.ending {
            headers.add(name: "Content-Length", value: String(declared))
        } else if case .complete = response.ending, !declaresLength(response), !bodiless {
            headers.add(name: "Content-Length", value: String(response.body.count))
        }
        return HTTPResponseHead(version: .http1_1, status: HTTPResponseStatus(statusCode: response.status), headers: headers)
    }

    private func answer(_ request: Request) async -> Response {
        let handler: Handler = state.withLock { state in
            state.hits[request.path, default: 0] += 1
            if state.arrivals.count < Self.maxArrivals {
                state.arrivals.append(Arrival(path: request.path, version: request.version, connection: request.connection))
            }
            return state.routes[request.path] ?? fallback
        }
        do {
            return try await handler(request)
        } catch {
            return Response(status: 500, headers: [("Content-Type", "text/plain")], body: "handler failed: \(error)\n")
        }
    }

    private static func declaresLength(_ response: Response) -> Bool {
        response.headers.contains { $0.name.lowercased() == "content-length" }
    }

    static func serialize(_ response: Response, for request: Request) -> ByteBuffer {
        var out = ByteBuffer()
        let reason = response.reason ?? HTTPResponseStatus(statusCode: response.status).reasonPhrase
        out.writeString("HTTP/1.1 \(response.status) \(reason)\r\n")
        let bodiless = response.status < 200 || response.status == 204 || response.status == 304
        let framed = response.headers.contains {
            let name = $0.name.lowercased()
            return name == "content-length" || name == "transfer-encoding"
        }
        for (name, value) in response.headers {
            out.writeString("\(name): \(value)\r\n")
        }
        if case .closeAfterBody(let declared) = response.ending {
            out.writeString("Content-Length: \(declared)\r\n")
        } else if case .streamed = response.ending {
            if !framed && !bodiless { out.writeString("Transfer-Encoding: chunked\r\n") }
        } else if !framed && !bodiless {
            out.writeString("Content-Length: \(response.body.count)\r\n")
        }
        out.writeString("\r\n")
        if request.method != "HEAD" && !bodiless {
            out.writeBytes(response.body)
        }
        return out
    }
}
