import Foundation
import PorticoTesting
import Testing

/// Issue #45 end to end: the built `portico` binary (`transport: nio`, no `retry` middleware) in
/// front of `ClosingUpstream`, a server that closes kept-alive connections without a word. A
/// request the server hung up on, on a reused connection, is answered 200 from a new one, and
/// `portico_upstream_stale_retries_total` counts it; what must not go out twice does not.
/// (The race of a close that the gateway's loop has not read yet, held still, is in
/// `StaleConnectionTests`: only a test on the gateway's own loop can hold it.)
@Suite("Stale upstream connections through the portico binary (issue #45)", .serialized)
struct StaleConnectionEndToEndTests {
    /// One thread: every request uses the one event loop's pool, so the second request reuses
    /// the first one's upstream connection.
    static func yaml(upstreamPort: Int) -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: 1 }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        upstreams:
          closing: { url: "http://127.0.0.1:\(upstreamPort)", transport: nio, timeout: 60s, connect_timeout: 30s, idle_timeout: 600s }
        routes:
          - { name: all, match: { path_prefix: / }, upstream: closing }
        """
    }

    static func with(_ server: ClosingUpstream, _ body: (ProxyProcess) async throws -> Void) async throws {
        try await server.start()
        let portico: ProxyProcess
        do {
            portico = try await ProxyProcess.portico(yaml: yaml(upstreamPort: server.port))
        } catch {
            await server.shutdown()
            throw error
        }
        do {
            try await body(portico)
        } catch {
            portico.stop()
            await server.shutdown()
            throw error
        }
        portico.stop()
        await server.shutdown()
    }

    /// One request on a connection of its own: `STATUS BODY`, or `STATUS ERROR` for Portico's JSON error.
    static func send(_ portico: ProxyProcess, _ method: String, _ path: String, body: String = "") async throws -> String {
        let connection = try RawHTTPConnection(port: portico.port, timeout: .seconds(60))
        var head = "\(method) \(path) HTTP/1.1\r\nHost: gateway.test\r\nConnection: close\r\n"
        if method == "POST" { head += "Content-Length: \(body.utf8.count)\r\n" }
        try await connection.send(head + "\r\n" + body)
        let response = try #require(try await connection.readResponse())
        if response.status == 200 { return "200 \(response.bodyText)" }
        let error = (try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])?["error"] as? String
        return "\(response.status) \(error ?? response.bodyText)"
    }

    @Test("a GET the server hung up on is answered from a new connection; a POST it may have read is not sent twice")
    func hungUp() async throws {
        let server = ClosingUpstream(script: [.answer, .hangUp, .answer, .hangUp])
        try await Self.with(server) { portico async throws in
            #expect(try await Self.send(portico, "GET", "/one") == "200 GET /one ")
            #expect(try await portico.metric("portico_upstream_stale_retries_total") == 0)
            #expect(try await Self.send(portico, "GET", "/two") == "200 GET /two ")
            #expect(try await portico.metric("portico_upstream_stale_retries_total") == 1)
            #expect(server.requests.map { "\($0.connection) \($0.path)" } == ["1 /one", "1 /two", "2 /two"])
            // The POST hung up on went out on a reused connection: the server may have acted on it.
            #expect(try await Self.send(portico, "POST", "/pay", body: "12") == "502 upstream_unavailable")
            #expect(server.requests.filter { $0.path == "/pay" }.count == 1)
            #expect(try await portico.metric("portico_upstream_stale_retries_total") == 1)
        }
    }

    @Test("a response that had begun when the connection dropped is not resent: 502")
    func startedResponse() async throws {
        let server = ClosingUpstream(script: [.answer, .headThenClose])
        try await Self.with(server) { portico async throws in
            #expect(try await Self.send(portico, "GET", "/one") == "200 GET /one ")
            #expect(try await Self.send(portico, "GET", "/two") == "502 upstream_unavailable")
            #expect(server.accepted == 1)
            #expect(try await portico.metric("portico_upstream_stale_retries_total") == 0)
        }
    }

    @Test("after the server closed its idle connections, the next GET and POST are answered 200")
    func idleClosed() async throws {
        let server = ClosingUpstream()
        try await Self.with(server) { portico async throws in
            #expect(try await Self.send(portico, "GET", "/one") == "200 GET /one ")
            try #require(server.closeIdle().count == 1)
            // Whether the gateway read the close first (a new connection) or met it (a resend),
            // the answer is the same.
            #expect(try await Self.send(portico, "GET", "/two") == "200 GET /two ")
            try #require(server.closeIdle().count == 1)
            #expect(try await Self.send(portico, "POST", "/pay", body: "12") == "200 POST /pay 12")
            #expect(server.requests.filter { $0.path == "/pay" }.count == 1)
        }
    }
}
