import Foundation
import Portico
import PorticoTesting
import Testing

/// WebSocket through Portico (issue #35), between an upstream and a client built on Python's
/// `websockets` package (scripts/ws_upstream.py, scripts/ws_client.py; scripts/test installs it).
@Suite("WebSocket", .enabled(if: WebSocketLab.python != nil, "needs Python's websockets (scripts/test installs it)"))
struct WebSocketTests {
    static func config(upstreamPort: Int, idle: String = "1h", extraListen: String = "") throws -> PorticoConfig {
        try ConfigLoader.load(yaml: """
            listen: { port: 0\(extraListen) }
            upstreams:
              ws: { url: "http://127.0.0.1:\(upstreamPort)", transport: nio }
            credentials:
              token: { type: static, value: "Bearer relay-token" }
            middleware:
              log: { type: access_log }
              limit: { type: rate_limit, key: route, rate: 1000/s, burst: 1000 }
              auth: { type: auth, credential: token }
            routes:
              - { name: sockets, match: { path_prefix: / }, upstream: ws, websocket: true, websocket_idle_timeout: \(idle),
                  middleware: [log, limit, auth] }
            """, environment: [:])
    }

    @Test("text, binary, a 16 MiB message, fragmented messages, ping/pong and close codes both ways arrive unchanged")
    func echo() async throws {
        let upstream = try await WebSocketLab.upstream()
        defer { upstream.stop() }
        let capture = LogCapture(message: "request")
        let gateway = try TestGateway(try Self.config(upstreamPort: upstream.port), logger: capture.logger)
        let result = try await WebSocketLab.client("ws://127.0.0.1:\(gateway.port)", "echo")
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output.contains("ok echo"), "\(result.output)")
        // The client's close code reached the upstream; auth's header reached it on the handshake.
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /echo 4001" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        #expect(WebSocketLab.events(of: upstream).contains("open /echo authorization=Bearer relay-token"))
        await gateway.stop()
    }

    @Test("a handshake the upstream refuses with 403 reaches the client as a 403, and auth's header reached the upstream")
    func refused() async throws {
        let upstream = try await WebSocketLab.upstream()
        defer { upstream.stop() }
        let gateway = try TestGateway(try Self.config(upstreamPort: upstream.port))
        let result = try await WebSocketLab.client("ws://127.0.0.1:\(gateway.port)", "refused")
        #expect(result.status == 0, "\(result.output)")
        #expect(WebSocketLab.events(of: upstream).contains("refused authorization=Bearer relay-token"))
        await gateway.stop()
    }

    @Test("a client that resets its connection: the upstream sees the session close")
    func clientReset() async throws {
        let upstream = try await WebSocketLab.upstream()
        defer { upstream.stop() }
        let gateway = try TestGateway(try Self.config(upstreamPort: upstream.port))
        let result = try await WebSocketLab.client("ws://127.0.0.1:\(gateway.port)", "reset")
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream, timeout: .seconds(10)) { $0.hasPrefix("closed /echo") } != nil,
                "\(WebSocketLab.events(of: upstream))")
        await gateway.stop()
    }

    @Test("an upstream that drops its connection: the client sees the close at once")
    func upstreamDies() async throws {
        let upstream = try await WebSocketLab.upstream()
        defer { upstream.stop() }
        let gateway = try TestGateway(try Self.config(upstreamPort: upstream.port))
        let result = try await WebSocketLab.client("ws://127.0.0.1:\(gateway.port)", "upstream-dies")
        #expect(result.status == 0, "\(result.output)")
        await gateway.stop()
    }

    @Test("a session quiet both ways for websocket_idle_timeout is closed with 1001 to both sides")
    func idleTimeout() async throws {
        let upstream = try await WebSocketLab.upstream()
        defer { upstream.stop() }
        let capture = LogCapture(message: "request")
        let gateway = try TestGateway(try Self.config(upstreamPort: upstream.port, idle: "1s"), logger: capture.logger)
        let result = try await WebSocketLab.client("ws://127.0.0.1:\(gateway.port)", "wait-close", "1001")
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /hold 1001" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        await gateway.stop()
    }
}
