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
}
