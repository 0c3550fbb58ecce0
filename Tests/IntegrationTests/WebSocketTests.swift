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

    /// The test's upstream (scripts/ws_upstream.py) and a gateway in front of it with `config`,
    /// changed by `adjust`. The caller stops both (the upstream from `defer`).
    static func start(idle: String = "1h", extraListen: String = "", capture: LogCapture? = nil,
                      adjust: (inout PorticoConfig) -> Void = { _ in }) async throws -> (upstream: ExternalServer, gateway: TestGateway) {
        let upstream = try await WebSocketLab.upstream()
        do {
            var config = try config(upstreamPort: upstream.port, idle: idle, extraListen: extraListen)
            adjust(&config)
            return (upstream, try capture.map { try TestGateway(config, logger: $0.logger) } ?? TestGateway(config))
        } catch {
            upstream.stop()
            throw error
        }
    }

    /// Which listener a test's sessions come through: a plain one, or TLS, where libmicrohttpd
    /// terminates TLS and relays the session through a socketpair (its own buffers and ends).
    enum Listener: String, CaseIterable, Sendable {
        case plain, tls

        /// The listener's `tls:` for a YAML `listen:` line (", tls: {…}"), or "".
        func yaml() async throws -> String {
            guard self == .tls else { return "" }
            let certificates = try await TestCertificates.shared()
            return ", tls: { cert_file: \"\(certificates.server.certificateFile)\", key_file: \"\(certificates.server.keyFile)\" }"
        }

        /// The client's base URL for `port`, and the options ws_client.py needs for it.
        func client(port: Int) async throws -> (url: String, options: [String]) {
            switch self {
            case .plain: return ("ws://127.0.0.1:\(port)", [])
            case .tls: return ("wss://localhost:\(port)", ["--ca", try await TestCertificates.shared().ca.certificateFile])
            }
        }
    }

    /// `start` through `listener`: also the client's base URL and ws_client.py's options for it.
    static func start(_ listener: Listener, idle: String = "1h", capture: LogCapture? = nil) async throws
        -> (upstream: ExternalServer, gateway: TestGateway, url: String, options: [String]) {
        let (upstream, gateway) = try await start(idle: idle, extraListen: try await listener.yaml(), capture: capture)
        let (url, options) = try await listener.client(port: gateway.port)
        return (upstream, gateway, url, options)
    }

    /// A WebSocket handshake's headers, for requests sent without the client script.
    static let handshakeHeaders = [
        ("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ]

    /// Over TLS this once took past 120 s under load: libmicrohttpd 0.9.75 relayed 4 bytes per
    /// round (`portico_mhd_widen_tls_relay` gives it 16 KiB each way).
    @Test("text, binary, a 16 MiB message, fragmented messages, ping/pong and close codes both ways arrive unchanged",
          arguments: Listener.allCases)
    func echo(listener: Listener) async throws {
        let (upstream, gateway, url, options) = try await Self.start(listener, capture: LogCapture(message: "request"))
        defer { upstream.stop() }
        let result = try await WebSocketLab.client(url, "echo", nil, options)
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
        let (upstream, gateway) = try await Self.start()
        defer { upstream.stop() }
        let result = try await WebSocketLab.client("ws://127.0.0.1:\(gateway.port)", "refused")
        #expect(result.status == 0, "\(result.output)")
        #expect(WebSocketLab.events(of: upstream).contains("refused authorization=Bearer relay-token"))
        await gateway.stop()
    }

    /// Over TLS, libmicrohttpd 0.9.75's relay does not pass the client's leaving on: the shard's
    /// hang-up watch does (without it the upstream never heard).
    @Test("a client that resets its connection: the upstream sees the session close", arguments: Listener.allCases)
    func clientReset(listener: Listener) async throws {
        let (upstream, gateway, url, options) = try await Self.start(listener)
        defer { upstream.stop() }
        let result = try await WebSocketLab.client(url, "reset", nil, options)
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream, timeout: .seconds(30)) { $0.hasPrefix("closed /echo") } != nil,
                "\(WebSocketLab.events(of: upstream))")
        await gateway.stop()
    }

    @Test("an upstream that drops its connection: the client sees the close at once", arguments: Listener.allCases)
    func upstreamDies(listener: Listener) async throws {
        let capture = LogCapture(message: "request")
        let (upstream, gateway, url, options) = try await Self.start(listener, capture: capture)
        defer { upstream.stop() }
        // ws_client.py fails unless the session closes within 5 s of the upstream's drop, as the
        // drop came: 1006, no close frame (the upstream sent none; Portico must not make one up).
        let result = try await WebSocketLab.client(url, "upstream-dies", nil, options)
        #expect(result.status == 0, "\(result.output)")
        // The upstream's drop ended it (not the idle timeout, not the client): the upstream left
        // without a close code, and the session's line says who ended it.
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /echo none" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        try await Eventually.wait("the session's access-log line") { !capture.records.isEmpty }
        #expect(capture.records.map { $0["ended"]?.description } == ["upstream_closed"], "\(capture.records)")
        let took = try #require(result.output.firstMatch(of: /closed (\d+) ms after the upstream was told to drop/),
                                "\(result.output)")
        #expect(try #require(Int(took.output.1)) < 5000)
        await gateway.stop()
    }

    @Test("a session quiet both ways for websocket_idle_timeout is closed with 1001 to both sides", arguments: Listener.allCases)
    func idleTimeout(listener: Listener) async throws {
        let (upstream, gateway, url, options) = try await Self.start(listener, idle: "1s", capture: LogCapture(message: "request"))
        defer { upstream.stop() }
        let result = try await WebSocketLab.client(url, "wait-close", "1001", options)
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /hold 1001" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        await gateway.stop()
    }

    @Test("rate_limit counts the handshake: past the limit a handshake is answered 429 and never reaches the upstream")
    func rateLimitCountsHandshakes() async throws {
        let upstream = try await WebSocketLab.upstream()
        defer { upstream.stop() }
        let config = try ConfigLoader.load(yaml: """
            upstreams:
              ws: { url: "http://127.0.0.1:\(upstream.port)", transport: nio }
            middleware:
              limit: { type: rate_limit, key: route, rate: 1/h, burst: 1 }
            routes:
              - { name: sockets, match: { path_prefix: / }, upstream: ws, websocket: true, middleware: [limit] }
            """, environment: [:])
        let gateway = try TestGateway(config)
        let first = try await WebSocketLab.client("ws://127.0.0.1:\(gateway.port)", "refused")
        #expect(first.status == 0, "\(first.output)")
        let second = try await gateway.request("GET", "/refuse", headers: Self.handshakeHeaders)
        #expect(second.status == 429)
        #expect(WebSocketLab.events(of: upstream).filter { $0.hasPrefix("refused") }.count == 1)
        await gateway.stop()
    }

    @Test("an upgraded connection is not closed by listen.idle_timeout (libmicrohttpd's): only websocket_idle_timeout applies")
    func listenIdleTimeoutDoesNotApply() async throws {
        let (upstream, gateway) = try await Self.start(extraListen: ", idle_timeout: 1s")
        defer { upstream.stop() }
        let go = FileManager.default.temporaryDirectory.appendingPathComponent("portico-ws-go-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: go) }
        let url = "ws://127.0.0.1:\(gateway.port)"
        let client = Task { try await WebSocketLab.client(url, "reload-echo", go) }
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0.hasPrefix("open /echo") } != nil)
        // Quiet for well past the listener's idle timeout (what is tested is that nothing happens meanwhile).
        try await Task.sleep(for: .milliseconds(2500))
        #expect(FileManager.default.createFile(atPath: go, contents: Data()))
        let result = try await client.value
        #expect(result.status == 0, "\(result.output)")
        await gateway.stop()
    }

    @Test("upgraded connections count toward listen.connection_limit")
    func connectionLimitCountsSessions() async throws {
        let (upstream, gateway) = try await Self.start(extraListen: ", connection_limit: 2")
        defer { upstream.stop() }
        let url = "ws://127.0.0.1:\(gateway.port)"
        let holders = (0..<2).map { _ in Task { try await WebSocketLab.client(url, "wait-close") } }
        let deadline = ContinuousClock.now.advanced(by: .seconds(60))
        while ContinuousClock.now < deadline, WebSocketLab.events(of: upstream).filter({ $0.hasPrefix("open /hold") }).count < 2 {
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(WebSocketLab.events(of: upstream).filter { $0.hasPrefix("open /hold") }.count == 2)
        // Two sessions hold the two connections: a third connection is closed unanswered.
        let third = try gateway.connect()
        try? await third.send("GET /ping HTTP/1.1\r\nHost: gw\r\n\r\n")
        let answer = try? await third.readResponse()
        #expect(answer == nil)
        await gateway.stop()
        for holder in holders {
            let held = try await holder.value
            #expect(held.status == 0, "\(held.output)")
        }
    }

    @Test("tracing: one server span for the session, ended when the session ends, with how it ended; the demo's echo route")
    func tracingSpan() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let demo = try TracingTests.Demo(tracingEndpoint: receiver.endpoint)
        let go = FileManager.default.temporaryDirectory.appendingPathComponent("portico-ws-go-\(UUID().uuidString)").path
        #expect(FileManager.default.createFile(atPath: go, contents: Data()))
        defer { try? FileManager.default.removeItem(atPath: go) }
        // ws://…/ws + /echo: the demo's echo route.
        let result = try await WebSocketLab.client("ws://127.0.0.1:\(demo.gateway.port)/ws", "reload-echo", go)
        #expect(result.status == 0, "\(result.output)")
        let spans = try await receiver.waitForSpans("the session's server span") { spans in
            spans.contains { $0.kind == "server" && $0.attributes["portico.websocket.end"] != nil }
        }
        await demo.stop()
        let servers = spans.filter { $0.kind == "server" }
        #expect(servers.count == 1, "\(spans)")
        let server = try #require(servers.first)
        #expect(server.name == "GET /ws/echo")
        #expect(server.attributes["http.response.status_code"] == .int(101))
        #expect(server.attributes["portico.websocket.bytes_in"] != nil)
    }

    @Test("a frame sent in the same write as the handshake (read by libmicrohttpd past the head) reaches the upstream first")
    func framePipelinedWithHandshake() async throws {
        let (upstream, gateway) = try await Self.start()
        defer { upstream.stop() }
        let connection = try gateway.connect()
        let text = Array("pipelined-frame".utf8)
        let mask: [UInt8] = [7, 1, 9, 3]
        let frame = [0x81, 0x80 | UInt8(text.count)] + mask + text.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        let handshake = "GET /echo HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        try await connection.send(Array(handshake.utf8) + frame)
        #expect(try await connection.receive("101 Switching Protocols"))
        #expect(try await connection.receive("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "the upstream's Sec-WebSocket-Accept")
        // The upstream echoes it, unmasked.
        #expect(try await connection.receive("pipelined-frame"))
        connection.reset()
        await gateway.stop()
    }

    @Test("max_websockets caps the sessions open at once: past it a handshake is answered 503")
    func maxWebsockets() async throws {
        let (upstream, gateway) = try await Self.start(extraListen: ", max_websockets: 1")
        defer { upstream.stop() }
        let url = "ws://127.0.0.1:\(gateway.port)"
        let holder = Task { try await WebSocketLab.client(url, "wait-close") }
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0.hasPrefix("open /hold") } != nil)
        let refused = try await gateway.request("GET", "/echo", headers: Self.handshakeHeaders)
        #expect(refused.status == 503)
        #expect(refused.bodyText.contains("overloaded"))
        // Stopping ends the held session (1001), and the client sees its close.
        await gateway.stop()
        let held = try await holder.value
        #expect(held.status == 0, "\(held.output)")
    }

    @Test("a reload leaves open sessions alone")
    func reloadKeepsSessions() async throws {
        let (upstream, gateway) = try await Self.start()
        defer { upstream.stop() }
        let go = FileManager.default.temporaryDirectory.appendingPathComponent("portico-ws-go-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: go) }
        let url = "ws://127.0.0.1:\(gateway.port)"
        let client = Task { try await WebSocketLab.client(url, "reload-echo", go) }
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0.hasPrefix("open /echo") } != nil)
        var changed = try Self.config(upstreamPort: upstream.port)
        changed.routes[0].websocketIdleTimeout = .seconds(600)
        try gateway.server.reload(changed)
        #expect(FileManager.default.createFile(atPath: go, contents: Data()))
        let result = try await client.value
        #expect(result.status == 0, "\(result.output)")
        await gateway.stop()
    }
}

/// WebSocket sessions through the `portico` binary: SIGTERM's drain, the access log's line,
/// the metrics, and memory per idle session.
@Suite("WebSocket: the portico process", .enabled(if: WebSocketLab.python != nil, "needs Python's websockets (scripts/test installs it)"))
struct WebSocketProcessTests {
    static func yaml(upstreamPort: Int, extra: String = "") -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: 2, shutdown_grace: 300ms\(extra) }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        upstreams:
          ws: { url: "http://127.0.0.1:\(upstreamPort)", transport: nio }
        middleware:
          log: { type: access_log }
        routes:
          - { name: sockets, match: { path_prefix: / }, upstream: ws, websocket: true, middleware: [log] }
        """
    }

    /// The test's upstream and the portico process in front of it with `yaml`. The caller stops
    /// both (from `defer`).
    static func start(extra: String = "") async throws -> (upstream: ExternalServer, proxy: ProxyProcess) {
        let upstream = try await WebSocketLab.upstream()
        do {
            return (upstream, try await ProxyProcess.portico(yaml: yaml(upstreamPort: upstream.port, extra: extra)))
        } catch {
            upstream.stop()
            throw error
        }
    }

    @Test("one access-log line per session at its end (bytes each way, duration, how it ended) and the session metrics")
    func logAndMetrics() async throws {
        let (upstream, proxy) = try await Self.start()
        defer { upstream.stop() }
        defer { proxy.stop() }
        let result = try await WebSocketLab.client("ws://127.0.0.1:\(proxy.port)", "echo")
        #expect(result.status == 0, "\(result.output)")
        // Both sessions are over once the upstream has seen both closes (a close handshake ends
        // with the server closing its connection: `upstream_closed`).
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /echo 4001" } != nil)
        // A client that resets: `client_closed`.
        let reset = try await WebSocketLab.client("ws://127.0.0.1:\(proxy.port)", "reset")
        #expect(reset.status == 0, "\(reset.output)")
        var closes = 0.0
        let deadline = ContinuousClock.now.advanced(by: .seconds(30))
        while ContinuousClock.now < deadline {
            closes = (try? await proxy.metric("portico_websocket_closes_total")) ?? 0
            if closes >= 3 { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(closes == 3)
        #expect(try await proxy.metric("portico_websocket_sessions") == 0)
        // 16 MiB each way, and more.
        #expect(try await proxy.metric("portico_websocket_bytes_total") > 2 * 16 * 1024 * 1024)
        let lines = proxy.log.split(separator: "\n").filter { $0.contains("msg=request") && $0.contains("status=101") }
        #expect(lines.count == 3, "\(proxy.log)")
        #expect(lines.filter { $0.contains("ended=upstream_closed") }.count == 2, "\(lines)")
        #expect(lines.filter { $0.contains("ended=client_closed") }.count == 1, "\(lines)")
        let big = lines.first { $0.contains("ended=upstream_closed") && $0.contains("bytes_in=1677") }
        let bytesIn = big.flatMap { $0.split(separator: " ").first { $0.hasPrefix("bytes_in=") } }.flatMap { Int($0.dropFirst(9)) }
        #expect((bytesIn ?? 0) > 16 * 1024 * 1024, "\(String(describing: big))")
        await proxy.terminate()
    }

    /// Over TLS the 1001 frames go through libmicrohttpd's relay, which must still run then.
    @Test("SIGTERM: sessions get the grace period, then a close frame 1001 on both sides",
          arguments: WebSocketTests.Listener.allCases)
    func drain(listener: WebSocketTests.Listener) async throws {
        let (upstream, proxy) = try await Self.start(extra: try await listener.yaml())
        defer { upstream.stop() }
        defer { proxy.stop() }
        let (url, options) = try await listener.client(port: proxy.port)
        let client = Task { try await WebSocketLab.client(url, "wait-close", "1001", options) }
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0.hasPrefix("open /hold") } != nil)
        await proxy.terminate()
        let result = try await client.value
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /hold 1001" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        #expect(proxy.log.contains("ended=drained"), "\(proxy.log)")
    }

    @Test("SIGTERM with a frame in progress: it is relayed to its end, then each side gets its close frame 1001")
    func drainFinishesFrameInProgress() async throws {
        let (upstream, proxy) = try await Self.start()
        defer { upstream.stop() }
        defer { proxy.stop() }
        // The client sends one 2 MiB frame over about 1.3 s; the grace (300 ms) ends in its middle.
        let client = Task { try await WebSocketLab.client("ws://127.0.0.1:\(proxy.port)", "slow-frame") }
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0.hasPrefix("open /hold") } != nil)
        await proxy.terminate()
        let result = try await client.value
        #expect(result.status == 0, "\(result.output)")
        // The whole message reached the upstream, then a well-formed 1001 (inserted mid-frame it
        // would be a protocol error; without it the upstream would see no close code).
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /hold 1001" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        #expect(WebSocketLab.events(of: upstream).contains("message /hold \(2 << 20)"), "\(WebSocketLab.events(of: upstream))")
    }

    /// Measured on the 2-core development machine (Swift 6.3.1, debug build, 2 threads, twice):
    /// 1,000 idle sessions grew Portico's RSS by 40.1 MB, 40.1 KB a session. Per session Portico
    /// holds the client's connection — libmicrohttpd's connection and its memory pool, up to
    /// `max_header_bytes` + 16 KiB = 48 KiB of which only the pages touched count — a NIO
    /// channel on each side with its pipeline and relay handler, and a few descriptors; socket
    /// buffers are the kernel's, not RSS. The bound, 64 KiB, is that pool fully touched plus
    /// 16 KiB for the two channels: a session costing more would be holding bytes it relays.
    static let idleSessionBytesBound = 64 * 1024

    @Test("1,000 concurrent idle sessions: RSS growth recorded and bounded; every session still echoes")
    func thousandIdleSessions() async throws {
        let (upstream, proxy) = try await Self.start()
        defer { upstream.stop() }
        defer { proxy.stop() }
        let url = "ws://127.0.0.1:\(proxy.port)"
        // Warm up: the first sessions make the loops' and allocators' first allocations.
        let warm = try await WebSocketLab.client(url, "echo")
        #expect(warm.status == 0, "\(warm.output)")
        let before = try proxy.memory().current
        let release = FileManager.default.temporaryDirectory.appendingPathComponent("portico-ws-many-\(UUID().uuidString)").path
        defer {
            try? FileManager.default.removeItem(atPath: release)
            try? FileManager.default.removeItem(atPath: release + ".open")
        }
        let count = 1000
        let client = Task { try await WebSocketLab.client(url, "many", String(count), [release], timeout: .seconds(300)) }
        let deadline = ContinuousClock.now.advanced(by: .seconds(240))
        while ContinuousClock.now < deadline, !FileManager.default.fileExists(atPath: release + ".open") {
            try await Task.sleep(for: .milliseconds(100))
        }
        #expect(FileManager.default.fileExists(atPath: release + ".open"), "the sessions did not all open")
        #expect(try await proxy.metric("portico_websocket_sessions") == Double(count))
        let after = try proxy.memory().current
        let perSession = (after - before) / count
        print("websocket: \(count) idle sessions grew RSS by \(after - before) bytes (\(perSession) bytes per session)")
        #expect(perSession < Self.idleSessionBytesBound, "\(perSession) bytes per idle session")
        #expect(FileManager.default.createFile(atPath: release, contents: Data()))
        let result = try await client.value
        #expect(result.status == 0, "\(result.output)")
        await proxy.terminate()
    }

    /// What a session may hold in Portico while one side does not read: NIO's write buffer water
    /// marks (64 KiB high) on the blocked side and one read (at most 64 KiB) from the other,
    /// plus allocator slack. 8 MiB is far above that and far below what the sender pushes (the
    /// sender stalls after the kernel's and the peers' buffers are full: several MiB).
    static let stalledSessionBytesBound = 8 * 1024 * 1024

    @Test("backpressure both ways: a peer that does not read stops the other's sending, and Portico holds no backlog")
    func backpressure() async throws {
        let (upstream, proxy) = try await Self.start()
        defer { upstream.stop() }
        defer { proxy.stop() }
        let url = "ws://127.0.0.1:\(proxy.port)"
        let warm = try await WebSocketLab.client(url, "echo")
        #expect(warm.status == 0, "\(warm.output)")
        let hold = FileManager.default.temporaryDirectory.appendingPathComponent("portico-ws-hold-\(UUID().uuidString)").path
        defer {
            try? FileManager.default.removeItem(atPath: hold)
            try? FileManager.default.removeItem(atPath: hold + ".stalled")
        }

        // Client to upstream: the upstream reads nothing; the client's sends stall.
        let before = try proxy.memory().current
        let sender = Task { try await WebSocketLab.client(url, "stall-upstream", hold) }
        let deadline = ContinuousClock.now.advanced(by: .seconds(120))
        while ContinuousClock.now < deadline, !FileManager.default.fileExists(atPath: hold + ".stalled") {
            try await Task.sleep(for: .milliseconds(100))
        }
        let sent = Int((try? String(contentsOfFile: hold + ".stalled", encoding: .utf8)) ?? "") ?? -1
        let towardUpstream = try proxy.memory().current - before
        #expect(sent > 0, "the client never stalled")
        #expect(towardUpstream < Self.stalledSessionBytesBound, "Portico grew \(towardUpstream) bytes; the client sent \(sent)")

        // Upstream to client: the client reads nothing; the upstream's sends stall.
        let reader = Task { try await WebSocketLab.client(url, "ignore-flood", hold) }
        let stalled = await WebSocketLab.waitForEvent(of: upstream, timeout: .seconds(120)) { $0.hasPrefix("flood stalled after") }
        let towardClient = try proxy.memory().current - before
        #expect(stalled != nil, "\(WebSocketLab.events(of: upstream))")
        #expect(towardClient < Self.stalledSessionBytesBound, "Portico grew \(towardClient) bytes; \(stalled ?? "")")
        print("websocket backpressure: client sent \(sent) before stalling, Portico grew \(towardUpstream) bytes; "
              + "\(stalled ?? "no stall"), Portico grew \(towardClient) bytes")

        #expect(FileManager.default.createFile(atPath: hold, contents: Data()))
        let senderResult = try await sender.value
        let readerResult = try await reader.value
        #expect(senderResult.status == 0, "\(senderResult.output)")
        #expect(readerResult.status == 0, "\(readerResult.output)")
        await proxy.terminate()
    }
}
