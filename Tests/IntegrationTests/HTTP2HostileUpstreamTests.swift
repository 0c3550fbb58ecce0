import Foundation
import Portico
import PorticoTesting
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// HTTP/2 upstreams that misbehave (issue #45), against scripts/h2_upstream.py (Python's `h2`,
/// which Portico did not write; the hostile answers are frames it builds by hand): floods of
/// header, CONTINUATION, SETTINGS, PING, RST_STREAM and empty DATA frames, an absurd SETTINGS
/// value, a malformed frame, a server that stops reading, trailers, and GOAWAY at a reload and
/// at SIGTERM. The server records what it saw (`HTTP2Lab.Event`), so the tests check both ends.
@Suite("HTTP/2 upstreams that misbehave (issue #45)", .serialized,
       // scripts/test installs h2 and sets PORTICO_REQUIRE_H2=1: there a missing h2 fails the suite.
       .enabled(if: HTTP2Lab.python != nil || ProcessInfo.processInfo.environment["PORTICO_REQUIRE_H2"] == "1",
                "needs Python's h2 (scripts/test installs it)"))
struct HTTP2HostileUpstreamTests {
    /// One hostile answer and what it must come to.
    struct Attack: Sendable, CustomTestStringConvertible {
        var kind: String
        /// The caller's JSON error (either of two where the limit and the reset race in one read).
        var error: Set<String>
        /// RFC 9113 error codes the GOAWAY may carry.
        var goAway: Set<Int>
        var testDescription: String { kind }
    }

    static let protocolError = 0x1, internalError = 0x2, frameSizeError = 0x6, compressionError = 0x9, enhanceYourCalm = 0xb

    static let attacks: [Attack] = [
        // A 1 MiB header block: past SETTINGS_MAX_HEADER_LIST_SIZE (64 KiB) at its fifth frame.
        Attack(kind: "huge-headers", error: ["upstream_protocol_error"], goAway: [protocolError]),
        // 6000 tiny fields: a 30 KB block, but a 200 KB list as RFC 9113 counts it (HPACK's decoder refuses it).
        Attack(kind: "many-headers", error: ["upstream_protocol_error"], goAway: [internalError, compressionError, protocolError]),
        // HEADERS without END_HEADERS, then CONTINUATION frames without end.
        Attack(kind: "continuation-flood", error: ["upstream_protocol_error"], goAway: [enhanceYourCalm]),
        Attack(kind: "settings-flood", error: ["upstream_protocol_error"], goAway: [enhanceYourCalm]),
        Attack(kind: "ping-flood", error: ["upstream_protocol_error"], goAway: [enhanceYourCalm]),
        // The first RST_STREAM ends the request (a reset: 502 upstream_unavailable), the flood then ends the
        // connection: when both come in one read, the connection's error is what the caller hears.
        Attack(kind: "rst-flood", error: ["upstream_unavailable", "upstream_protocol_error"], goAway: [enhanceYourCalm]),
        // A declared Content-Length, then empty DATA frames without end.
        Attack(kind: "empty-data-flood", error: ["upstream_protocol_error"], goAway: [enhanceYourCalm]),
        // SETTINGS_MAX_FRAME_SIZE of 2^24, above the largest RFC 9113 allows.
        Attack(kind: "max-frame-size", error: ["upstream_protocol_error"], goAway: [protocolError]),
        // A PING of 7 bytes.
        Attack(kind: "malformed-frame", error: ["upstream_protocol_error"], goAway: [frameSizeError, protocolError]),
    ]

    /// Portico with the hostile upstream (`/`) and a second, honest one (`/good/…`) on its own connections.
    static func portico(hostile: ExternalServer, good: ExternalServer, threads: Int = 2, extra: String = "") async throws -> ProxyProcess {
        try await ProxyProcess.portico(yaml: """
            listen: { address: 127.0.0.1, port: 0, threads: \(threads) }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: info, format: logfmt }
            upstreams:
              hostile: { url: "http://127.0.0.1:\(hostile.port)", transport: nio, protocol: http2, timeout: 60s, connect_timeout: 30s\(extra) }
              good: { url: "http://127.0.0.1:\(good.port)", transport: nio, protocol: http2, timeout: 60s, connect_timeout: 30s }
            routes:
              - { name: good, match: { path_prefix: /good }, upstream: good, strip_prefix: true }
              - { name: all, match: { path_prefix: / }, upstream: hostile }
            """)
    }

    static func request(_ portico: ProxyProcess, _ target: String, method: String = "GET", body: [UInt8] = []) async throws -> RawHTTPResponse {
        try await HTTP2UpstreamTests.request(portico, target, method: method, body: body)
    }

    static func json(_ response: RawHTTPResponse) -> [String: String] {
        ((try? JSONSerialization.jsonObject(with: Data(response.body))) as? [String: String]) ?? [:]
    }

    @Test("a hostile upstream: the caller gets a 502 with a JSON body, the connection is closed after a bounded flood, memory stays flat, other connections carry on",
          .timeLimit(.minutes(5)), arguments: attacks)
    func hostile(_ attack: Attack) async throws {
        let hostile = try await HTTP2Lab.upstream()
        defer { hostile.stop() }
        let good = try await HTTP2Lab.upstream()
        defer { good.stop() }
        let portico = try await Self.portico(hostile: hostile, good: good)
        defer { portico.stop() }
        // Warm both paths (connections open, buffers grown) before the memory baseline.
        #expect(try await Self.request(portico, "/ok").status == 200)
        #expect(try await Self.request(portico, "/good/ok").status == 200)
        let before = try portico.memory()

        // Streams on the honest upstream's connections, in flight while the attack runs.
        let body = HTTP2Lab.pattern(512 << 10)
        async let others = withThrowingTaskGroup(of: Bool.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    let response = try await Self.request(portico, "/good/slow?bytes=\(body.count)&ms=5")
                    return response.status == 200 && response.body == body
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
        let response = try await Self.request(portico, "/attack/\(attack.kind)")
        #expect(response.status == 502, "\(response.status) \(response.bodyText)")
        let json = Self.json(response)
        #expect(attack.error.contains(json["error"] ?? ""), "\(response.bodyText)")
        #expect(json["request_id"]?.isEmpty == false)

        // The server's side: Portico said GOAWAY with the limit's code and closed the connection,
        // long before the flood's cap (256 MiB or a minute); a flood Portico kept reading would reach it.
        let record = await HTTP2Lab.waitForEvent(of: hostile, timeout: .seconds(90)) { $0.event == "attack" }
        let seen = try #require(record, "the attack's record; events: \(HTTP2Lab.events(of: hostile))")
        #expect(seen.ending == "closed", "\(seen)")
        // NIOHTTP2's GOAWAY goes out first; but Portico closes with the flood unread, so the kernel
        // resets the connection and the server may lose the GOAWAY with its unread input
        // (measured: the SETTINGS, PING and empty DATA floods). When it arrived, its code is the limit's.
        if let code = seen.goaway { #expect(attack.goAway.contains(code), "GOAWAY's code: \(seen)") }
        #expect((seen.bytes ?? .max) < 32 << 20, "bytes sent before the close: \(seen)")

        let fine = try await others
        #expect(fine.count == 8 && fine.allSatisfy { $0 }, "the honest upstream's streams arrive whole")
        // The gateway keeps serving, the hostile upstream too on a new connection.
        #expect(try await Self.request(portico, "/ok").status == 200)
        #expect(try await Self.request(portico, "/good/ok").status == 200)
        let after = try portico.memory()
        #expect(after.peak - before.peak < 48 << 20,
                "peak RSS grew \((after.peak - before.peak) >> 20) MiB during the attack (before \(before.peak >> 20) MiB)")
        print("hostile upstream \(attack.kind): \(seen.frames ?? 0) frames, \(seen.bytes ?? 0) bytes sent before the close, GOAWAY \(seen.goaway ?? -1), peak RSS \(before.peak >> 20) -> \(after.peak >> 20) MiB")
    }

    @Test("an absurd SETTINGS_HEADER_TABLE_SIZE (2^32-1) changes nothing: requests are answered on that connection")
    func absurdHeaderTableSize() async throws {
        let hostile = try await HTTP2Lab.upstream()
        defer { hostile.stop() }
        let good = try await HTTP2Lab.upstream()
        defer { good.stop() }
        let portico = try await Self.portico(hostile: hostile, good: good, threads: 1)
        defer { portico.stop() }
        let first = try await Self.request(portico, "/attack/header-table-size")
        #expect(first.status == 200 && first.bodyText == "ok\n", "\(first.status) \(first.bodyText)")
        for _ in 0..<3 {
            #expect(try await Self.request(portico, "/ok").bodyText == "ok\n")
        }
        let requests = HTTP2Lab.events(of: hostile).filter { $0.event == "request" }
        #expect(requests.count == 4)
        #expect(Set(requests.compactMap(\.conn)).count == 1, "one connection throughout: \(requests)")
    }

    @Test("an upstream that stops reading a request body (its stream window shut): 504 at the timeout, the stream reset, the connection's other streams flow",
          .timeLimit(.minutes(5)))
    func stalledWindow() async throws {
        let hostile = try await HTTP2Lab.upstream()
        defer { hostile.stop() }
        let good = try await HTTP2Lab.upstream()
        defer { good.stop() }
        // One thread: one connection carries the stalled stream and the others. timeout: 3s.
        let portico = try await ProxyProcess.portico(yaml: """
            listen: { address: 127.0.0.1, port: 0, threads: 1 }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: info, format: logfmt }
            upstreams:
              hostile: { url: "http://127.0.0.1:\(hostile.port)", transport: nio, protocol: http2, timeout: 3s, connect_timeout: 30s }
            routes:
              - { name: all, match: { path_prefix: / }, upstream: hostile }
            """)
        defer { portico.stop() }
        // 60 KB: buffered whole by Portico (below 64 KiB), four times the server's 16 KiB stream window.
        let upload = RandomBytes.make(60_000)
        let started = ContinuousClock.now
        async let stalled = Self.request(portico, "/stall", method: "POST", body: upload)
        // The stalled stream is open (the server saw its request) before the others go.
        _ = try #require(await HTTP2Lab.waitForEvent(of: hostile) { $0.event == "request" && $0.path == "/stall" })
        for _ in 0..<4 {
            #expect(try await Self.request(portico, "/ok").bodyText == "ok\n")
            let small = RandomBytes.make(8_000)
            let echoed = try await Self.request(portico, "/echo", method: "POST", body: small)
            #expect(echoed.status == 200 && echoed.body == small, "an upload beside the stalled one")
        }
        let response = try await stalled
        let waited = ContinuousClock.now - started
        #expect(response.status == 504, "\(response.status) \(response.bodyText)")
        #expect(Self.json(response)["error"] == "upstream_timeout")
        #expect(waited >= .seconds(3), "answered after \(waited), before the 3 s timeout")
        // Portico reset the stream (CANCEL) and the connection stayed: the server got no more than the window.
        let received = try #require(await HTTP2Lab.waitForEvent(of: hostile) { $0.event == "received" }, "\(HTTP2Lab.events(of: hostile))")
        #expect(received.bytes == 16_384, "\(received)")
        let reset = HTTP2Lab.events(of: hostile).first { $0.event == "reset" }
        #expect(reset?.code == 0x8, "RST_STREAM(CANCEL): \(String(describing: reset))")
        #expect(try await Self.request(portico, "/ok").bodyText == "ok\n")
        let requests = HTTP2Lab.events(of: hostile).filter { $0.event == "request" }
        #expect(Set(requests.compactMap(\.conn)).count == 1, "one connection throughout: \(requests)")
        #expect(!HTTP2Lab.events(of: hostile).contains { $0.event == "goaway" })
    }

    @Test("response trailers are dropped: the body arrives whole and chunked, no trailer field becomes a header, the connection carries on")
    func trailers() async throws {
        let hostile = try await HTTP2Lab.upstream()
        defer { hostile.stop() }
        let good = try await HTTP2Lab.upstream()
        defer { good.stop() }
        let portico = try await Self.portico(hostile: hostile, good: good, threads: 1)
        defer { portico.stop() }
        let connection = try RawHTTPConnection(port: portico.port, timeout: .seconds(60))
        for _ in 0..<2 {
            try await connection.send("GET /trailers HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
            let response = try #require(try await connection.readResponse())
            #expect(response.status == 200)
            #expect(response.bodyText == "hello\n")
            #expect(response.header("transfer-encoding")?.lowercased() == "chunked", "\(response.headers)")
            #expect(response.header("x-checksum") == nil && response.header("x-status") == nil, "\(response.headers)")
            #expect(response.header("trailer") == nil)
        }
        // Both on one upstream connection: a stream that ended with trailers leaves it whole.
        let requests = HTTP2Lab.events(of: hostile).filter { $0.event == "request" }
        #expect(requests.count == 2 && Set(requests.compactMap(\.conn)).count == 1, "\(requests)")
    }

    /// The reload test's gateway: one upstream, HTTP/2 to the test server.
    static func reloadConfig(_ server: ExternalServer, timeout: Duration) -> PorticoConfig {
        var config = PorticoConfig()
        config.listen.requestTimeout = .seconds(300)
        config.listen.headerTimeout = .seconds(300)
        var upstream = UpstreamConfig(name: "up", url: URL(string: "http://127.0.0.1:\(server.port)")!)
        upstream.transport = .nio
        upstream.httpProtocol = .http2
        upstream.connectTimeout = .seconds(30)
        upstream.timeout = timeout
        config.upstreams = ["up": upstream]
        var route = RouteConfig(name: "all", match: .init(pathPrefix: "/"), upstream: "up", timeout: .seconds(200))
        // Only the manual clock's moves end a stream's silence: it must not be the idle timeout.
        route.streamIdleTimeout = .seconds(10_000_000)
        config.routes = [route]
        return config
    }

    @Test("a reload retires the old HTTP/2 connections with GOAWAY: a stream in flight finishes byte-exact, no new stream goes there, then it closes",
          .timeLimit(.minutes(5)))
    func reloadSendsGoAway() async throws {
        let server = try await HTTP2Lab.upstream()
        defer { server.stop() }
        let config = Self.reloadConfig(server, timeout: .seconds(299))
        // The old runtime retires `request_timeout` + 1 s after the reload on the gateway's clock:
        // the test's, so the retirement comes while the stream flows, however slow the machine.
        let clock = ManualClock()
        let gateway = try TestGateway(config, clock: clock)
        // 2 MiB in 16 KiB chunks every 20 ms: about 2.6 s on the wire.
        let size = 2 << 20
        let client = try StreamingClient(port: gateway.port, timeout: .seconds(120))
        defer { client.close() }
        try await client.get("/slow?bytes=\(size)&ms=20")
        let head = try await client.readHead()
        try #require(head.status == 200, "\(head.status): \(head.bodyText)")
        var body = try await client.readBody(count: 64 << 10)
        let first = try #require(HTTP2Lab.events(of: server).first { $0.event == "request" && $0.path?.hasPrefix("/slow") == true })
        let old = try #require(first.conn)

        var changed = config
        changed.upstreams["up"]?.timeout = .seconds(298)
        try gateway.server.reload(changed)
        let linger = config.listen.requestTimeout + .seconds(1)
        try await Eventually.wait(timeout: .seconds(120), "the old runtime retired") {
            clock.advance(by: linger)
            return gateway.server.runtimesRetired == 1
        }
        // The new runtime's requests go on a new connection meanwhile.
        for _ in 0..<3 {
            #expect(try await gateway.request("GET", "/ok").bodyText == "ok\n")
        }
        let goAway = try #require(await HTTP2Lab.waitForEvent(of: server) { $0.event == "goaway" && $0.conn == old },
                                  "GOAWAY on the old connection; events: \(HTTP2Lab.events(of: server))")
        #expect(goAway.code == 0, "NO_ERROR: \(goAway)")
        body += try await client.readBody(count: size)
        #expect(try await client.readBodyToEnd() == .complete)
        let whole = body == HTTP2Lab.pattern(size)
        #expect(whole, "\(body.count) bytes of \(size), byte-exact: \(whole)")

        let events = HTTP2Lab.events(of: server)
        let order = events.map(\.description)
        let goAwayAt = events.firstIndex { $0.event == "goaway" && $0.conn == old }
        let doneAt = events.firstIndex { $0.event == "stream_done" && $0.conn == old }
        #expect(goAwayAt != nil && doneAt != nil && goAwayAt! < doneAt!, "GOAWAY while the stream flowed: \(order)")
        #expect(!events.contains { $0.event == "request" && $0.afterGoaway == true }, "no stream after GOAWAY: \(order)")
        #expect(events.filter { $0.event == "request" && $0.conn == old }.count == 1, "\(order)")
        #expect(events.contains { $0.event == "request" && $0.path == "/ok" && $0.conn != old }, "\(order)")
        // Closed once its stream ended.
        _ = try #require(await HTTP2Lab.waitForEvent(of: server) { $0.event == "closed" && $0.conn == old }, "\(order)")
        await gateway.stop()
    }

    @Test("SIGTERM drains: a stream in flight finishes byte-exact, then the HTTP/2 connection is closed with GOAWAY", .timeLimit(.minutes(5)))
    func drainSendsGoAway() async throws {
        let server = try await HTTP2Lab.upstream()
        defer { server.stop() }
        let portico = try await ProxyProcess.portico(yaml: """
            listen: { address: 127.0.0.1, port: 0, threads: 1, shutdown_grace: 60s }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: info, format: logfmt }
            upstreams:
              up: { url: "http://127.0.0.1:\(server.port)", transport: nio, protocol: http2, timeout: 60s, connect_timeout: 30s }
            routes:
              - { name: all, match: { path_prefix: / }, upstream: up }
            """)
        defer { portico.stop() }
        let size = 2 << 20
        let client = try StreamingClient(port: portico.port, timeout: .seconds(120))
        defer { client.close() }
        try await client.get("/slow?bytes=\(size)&ms=20")
        let head = try await client.readHead()
        try #require(head.status == 200, "\(head.status): \(head.bodyText)")
        var body = try await client.readBody(count: 64 << 10)
        #expect(kill(portico.pid, SIGTERM) == 0)
        body += try await client.readBody(count: size)
        #expect(try await client.readBodyToEnd() == .complete)
        let whole = body == HTTP2Lab.pattern(size)
        #expect(whole, "\(body.count) bytes of \(size), byte-exact: \(whole)")
        let goAway = try #require(await HTTP2Lab.waitForEvent(of: server) { $0.event == "goaway" },
                                  "GOAWAY at the drain; events: \(HTTP2Lab.events(of: server))")
        #expect(goAway.code == 0, "NO_ERROR: \(goAway)")
        let events = HTTP2Lab.events(of: server)
        #expect(events.contains { $0.event == "stream_done" && $0.conn == goAway.conn && $0.bytes == size }, "\(events)")
        #expect(!events.contains { $0.event == "request" && $0.afterGoaway == true }, "\(events)")
        try await Eventually.wait(timeout: .seconds(60), "Portico exits after the drain") { !portico.isRunning }
    }

    /// `/metrics`' lines for `name` (with their labels).
    static func metricLines(_ portico: ProxyProcess, _ name: String) async throws -> [String] {
        let connection = try RawHTTPConnection(port: try #require(portico.adminPort), timeout: .seconds(10))
        try await connection.send("GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        let response = try #require(try await connection.readResponse())
        return response.bodyText.split(separator: "\n").map(String.init).filter { $0.hasPrefix(name + "{") || $0.hasPrefix(name + " ") }
    }

    static func value(_ lines: [String], _ labels: [String]) -> Double? {
        lines.first { line in labels.allSatisfy { line.contains($0) } }.flatMap { $0.split(separator: " ").last }.flatMap { Double($0) }
    }

    @Test("metrics: request metrics carry protocol=http1|http2; HTTP/2 connections and streams per upstream, a balanced one's endpoints summed",
          .timeLimit(.minutes(5)))
    func protocolMetrics() async throws {
        let one = try await HTTP2Lab.upstream()
        defer { one.stop() }
        let two = try await HTTP2Lab.upstream()
        defer { two.stop() }
        let http1 = TestUpstream { _ in .text("one\n") }
        try await http1.start()
        let portico = try await ProxyProcess.portico(yaml: """
            listen: { address: 127.0.0.1, port: 0, threads: 1 }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: info, format: logfmt }
            upstreams:
              single: { url: "http://127.0.0.1:\(one.port)", transport: nio, protocol: http2, timeout: 60s }
              pair: { endpoints: ["http://127.0.0.1:\(one.port)", "http://127.0.0.1:\(two.port)"], transport: nio, protocol: http2, timeout: 60s }
              plain: { url: "http://127.0.0.1:\(http1.port)", transport: nio, timeout: 60s }
            routes:
              - { name: single, match: { path_prefix: /single }, upstream: single, strip_prefix: true }
              - { name: pair, match: { path_prefix: /pair }, upstream: pair, strip_prefix: true }
              - { name: plain, match: { path_prefix: /plain }, upstream: plain, strip_prefix: true }
            """)
        defer { portico.stop() }
        #expect(try await Self.request(portico, "/single/ok").status == 200)
        #expect(try await Self.request(portico, "/plain/x").status == 200)
        // Round robin over the pair: both endpoints get a connection.
        for _ in 0..<4 { #expect(try await Self.request(portico, "/pair/ok").status == 200) }
        #expect(try await Self.request(portico, "/single/nope").status == 404)

        let durations = try await Self.metricLines(portico, "portico_upstream_request_duration_seconds_count")
        #expect(Self.value(durations, [#"upstream="single""#, #"protocol="http2""#]) == 2, "\(durations)")
        #expect(Self.value(durations, [#"upstream="pair""#, #"protocol="http2""#]) == 4, "\(durations)")
        #expect(Self.value(durations, [#"upstream="plain""#, #"protocol="http1""#]) == 1, "\(durations)")
        #expect(!durations.contains { $0.contains(#"upstream="plain""#) && $0.contains(#"protocol="http2""#) }, "\(durations)")

        let connections = try await Self.metricLines(portico, "portico_upstream_http2_connections")
        #expect(Self.value(connections, [#"upstream="single""#]) == 1, "\(connections)")
        #expect(Self.value(connections, [#"upstream="pair""#]) == 2, "one per endpoint: \(connections)")

        // Streams open now: two slow responses in flight on the pair, one on the single upstream.
        let clients = try (0..<3).map { _ in try StreamingClient(port: portico.port, timeout: .seconds(120)) }
        defer { clients.forEach { $0.close() } }
        for (client, target) in zip(clients, ["/pair/slow?bytes=4194304&ms=50", "/pair/slow?bytes=4194304&ms=50", "/single/slow?bytes=4194304&ms=50"]) {
            try await client.get(target)
            #expect(try await client.readHead().status == 200)
        }
        let streams = try await Self.metricLines(portico, "portico_upstream_http2_streams")
        #expect(Self.value(streams, [#"upstream="pair""#]) == 2, "\(streams)")
        #expect(Self.value(streams, [#"upstream="single""#]) == 1, "\(streams)")
        await http1.shutdown()
    }
}
