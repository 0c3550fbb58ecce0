import Foundation
import Portico
import PorticoTesting
import Testing

/// What the HTTP server answers by itself reaches clients in the gateway's one JSON error shape.
@Suite("Server refusals through the real gateway")
struct ServerRefusalTests {
    @Test("a request its chain leaves unanswered gets the watchdog's 504 carrying the client's X-Request-ID")
    func watchdogKeepsRequestID() async throws {
        let upstream = TestUpstream()
        upstream.route("/api/never", .never)
        try await upstream.start()
        var config = PorticoConfig()
        config.listen.requestTimeout = .milliseconds(400)
        config.upstreams["app"] = UpstreamConfig(name: "app", url: URL(string: "http://127.0.0.1:\(upstream.port)")!)
        config.upstreams["app"]?.timeout = .seconds(60)
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api/"), upstream: "app", middleware: [])]
        // The chain's deadlines run on a clock that never moves (and the urlsession transport's
        // backstop is a minute away): only the server's own watchdog can answer.
        let gateway = try TestGateway(config, clock: ManualClock())
        let response = try await gateway.request("GET", "/api/never", headers: [("X-Request-ID", "client-chosen-42")])
        await gateway.stop()
        await upstream.shutdown()

        #expect(response.status == 504)
        #expect(response.header("content-type") == "application/json")
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        #expect(body.error == "request_timeout")
        #expect(body.message == "the request was not answered within its deadline")
        #expect(body.request_id == "client-chosen-42")
    }

    @Test("an oversized head gets a JSON 431")
    func headTooLarge() async throws {
        var config = PorticoConfig()
        config.listen.maxHeaderBytes = 4096
        config.routes = [RouteConfig(name: "ping", match: .init(path: "/ping"),
                                     direct: .init(status: 200, body: "pong"))]
        let gateway = try TestGateway(config)
        let response = try await gateway.request("GET", "/ping", headers: [("X-Big", String(repeating: "a", count: 8000))])
        await gateway.stop()
        #expect(response.status == 431)
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        #expect(body.error == "request_header_fields_too_large")
        #expect(body.message == "request head exceeds the limit of 4096 bytes")
        #expect(!body.request_id.isEmpty)
    }

    /// Edges #5: `urlsession` reads a streamed upload whole (at most 64 MiB), so a larger declared
    /// body is refused at its head — not read (and held) first — whatever `listen.max_body_bytes` allows.
    @Test("a declared upload over the urlsession transport's cap gets 413 before a byte of its body is read")
    func urlsessionUploadCapAtTheHead() async throws {
        let upstream = TestUpstream()
        upstream.route("/up", { request in .echo(request) })
        try await upstream.start()
        var config = PorticoConfig()
        config.listen.maxBodyBytes = 1 << 30
        config.upstreams["app"] = UpstreamConfig(name: "app", url: URL(string: "http://127.0.0.1:\(upstream.port)")!)
        config.routes = [RouteConfig(name: "up", match: .init(pathPrefix: "/up"), upstream: "app", middleware: [])]
        let gateway = try TestGateway(config)
        let connection = try gateway.connect()
        // The head only: the answer must come without the client sending any of its 256 MiB.
        try await connection.send("POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 268435456\r\n\r\n")
        let response = try #require(try await connection.readResponse())
        #expect(response.status == 413)
        #expect(response.header("connection") == "close")
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        #expect(body.error == "payload_too_large")
        #expect(body.message.contains("transport: nio"))
        #expect(upstream.hits("/up") == 0)
        // A body within the cap still goes through.
        let small = try await gateway.request("POST", "/up", body: Array(repeating: 0x61, count: 100_000))
        #expect(small.status == 200)
        await gateway.stop()
        await upstream.shutdown()
    }
}
