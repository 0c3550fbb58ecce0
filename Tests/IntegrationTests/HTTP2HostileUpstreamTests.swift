import Foundation
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
       .enabled(if: HTTP2Lab.python != nil, "needs Python's h2 (scripts/test installs it)"))
struct HTTP2HostileUpstreamTests {
    /// One hostile answer and what it must come to.
    struct Attack: Sendable, CustomTestStringConvertible {
        var kind: String
        /// The caller's JSON error.
        var error: String
        /// RFC 9113 error codes the GOAWAY may carry.
        var goAway: Set<Int>
        var testDescription: String { kind }
    }

    static let protocolError = 0x1, internalError = 0x2, frameSizeError = 0x6, compressionError = 0x9, enhanceYourCalm = 0xb

    static let attacks: [Attack] = [
        // A 1 MiB header block: past SETTINGS_MAX_HEADER_LIST_SIZE (64 KiB) at its fifth frame.
        Attack(kind: "huge-headers", error: "upstream_protocol_error", goAway: [protocolError]),
        // 6000 tiny fields: a 30 KB block, but a 200 KB list as RFC 9113 counts it (HPACK's decoder refuses it).
        Attack(kind: "many-headers", error: "upstream_protocol_error", goAway: [internalError, compressionError, protocolError]),
        // HEADERS without END_HEADERS, then CONTINUATION frames without end.
        Attack(kind: "continuation-flood", error: "upstream_protocol_error", goAway: [enhanceYourCalm]),
        Attack(kind: "settings-flood", error: "upstream_protocol_error", goAway: [enhanceYourCalm]),
        Attack(kind: "ping-flood", error: "upstream_protocol_error", goAway: [enhanceYourCalm]),
        // The first RST_STREAM ends the request (a reset: 502 upstream_unavailable), the flood then ends the connection.
        Attack(kind: "rst-flood", error: "upstream_unavailable", goAway: [enhanceYourCalm]),
        // A declared Content-Length, then empty DATA frames without end.
        Attack(kind: "empty-data-flood", error: "upstream_protocol_error", goAway: [enhanceYourCalm]),
        // SETTINGS_MAX_FRAME_SIZE of 2^24, above the largest RFC 9113 allows.
        Attack(kind: "max-frame-size", error: "upstream_protocol_error", goAway: [protocolError]),
        // A PING of 7 bytes.
        Attack(kind: "malformed-frame", error: "upstream_protocol_error", goAway: [frameSizeError, protocolError]),
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
        #expect(json["error"] == attack.error, "\(response.bodyText)")
        #expect(json["request_id"]?.isEmpty == false)

        // The server's side: Portico said GOAWAY with the limit's code and closed the connection,
        // long before the flood's cap (256 MiB or a minute); a flood Portico kept reading would reach it.
        let record = await HTTP2Lab.waitForEvent(of: hostile, timeout: .seconds(90)) { $0.event == "attack" }
        let seen = try #require(record, "the attack's record; events: \(HTTP2Lab.events(of: hostile))")
        #expect(seen.ending == "closed", "\(seen)")
        #expect(seen.goaway.map { attack.goAway.contains($0) } == true, "GOAWAY's code: \(seen)")
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
}
