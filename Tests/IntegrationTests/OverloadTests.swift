import Foundation
import Portico
import PorticoTesting
import Testing

/// Past an in-flight cap requests are refused at once with 503 `overloaded`, and the cap frees
/// up as requests finish.
@Suite("Overload guard")
struct OverloadTests {
    static func config(upstream: TestUpstream, listenCap: Int, routeCap: Int?) -> PorticoConfig {
        var config = PorticoConfig()
        config.listen.maxInFlight = listenCap
        // Held requests wait for the test, however slowly a loaded machine runs it.
        config.listen.requestTimeout = .seconds(300)
        config.listen.headerTimeout = .seconds(300)
        var settings = UpstreamConfig(name: "up", url: URL(string: "http://127.0.0.1:\(upstream.port)")!)
        settings.timeout = .seconds(300)
        config.upstreams = ["up": settings]
        config.routes = [
            RouteConfig(name: "held", match: .init(pathPrefix: "/held"), upstream: "up", maxInFlight: routeCap),
            RouteConfig(name: "other", match: .init(pathPrefix: "/other"), upstream: "up"),
        ]
        return config
    }

    static func holdingUpstream(_ release: AsyncGate) async throws -> TestUpstream {
        let upstream = TestUpstream()
        upstream.route("/held") { request in
            await release.wait()
            return .echo(request)
        }
        upstream.route("/other") { request in .echo(request) }
        try await upstream.start()
        return upstream
    }

    @Test("a route's cap: the next request gets a fast 503 overloaded; other routes are unaffected; freed caps admit again")
    func routeCap() async throws {
        let release = AsyncGate()
        let upstream = try await Self.holdingUpstream(release)
        let gateway = try TestGateway(Self.config(upstream: upstream, listenCap: 0, routeCap: 2))
        var held: [RawHTTPConnection] = []
        for _ in 0..<2 {
            let connection = try gateway.connect()
            try await connection.send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(connection)
        }
        try await Eventually.wait { gateway.server.inFlightRequests == 2 }

        let refused = try await gateway.request("GET", "/held")
        #expect(refused.status == 503)
        #expect(refused.header("retry-after") == "1")
        let body = try JSONSerialization.jsonObject(with: Data(refused.body)) as? [String: Any]
        #expect(body?["error"] as? String == "overloaded")
        #expect((body?["message"] as? String)?.contains("route held") == true)
        #expect(body?["request_id"] as? String == refused.header("x-request-id"))
        #expect(try await gateway.request("GET", "/other").status == 200)

        release.open()
        for connection in held {
            #expect(try #require(try await connection.readResponse()).status == 200)
        }
        #expect(try await gateway.request("GET", "/held").status == 200)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("the listener's cap counts every route")
    func listenerCap() async throws {
        let release = AsyncGate()
        let upstream = try await Self.holdingUpstream(release)
        let gateway = try TestGateway(Self.config(upstream: upstream, listenCap: 3, routeCap: nil))
        var held: [RawHTTPConnection] = []
        for _ in 0..<3 {
            let connection = try gateway.connect()
            try await connection.send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
            held.append(connection)
        }
        try await Eventually.wait { gateway.server.inFlightRequests == 3 }
        let refused = try await gateway.request("GET", "/other")
        #expect(refused.status == 503)
        #expect(refused.bodyText.contains("in the gateway"))

        release.open()
        for connection in held {
            #expect(try #require(try await connection.readResponse()).status == 200)
        }
        #expect(try await gateway.request("GET", "/other").status == 200)
        await gateway.stop()
        await upstream.shutdown()
    }
}
