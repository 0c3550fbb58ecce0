import Foundation
import Portico
import PorticoTesting
import Testing

/// How the gateway reaches the upstream in one run of the suite: each transport over plain
/// HTTP, and over HTTPS (a test CA) for the transports that can trust a custom CA; on `nio`,
/// HTTP/1.1 and HTTP/2 (h2c in cleartext, ALPN `h2` over TLS; the upstream speaks that alone).
struct ProxyLeg: Sendable, CustomTestStringConvertible {
    var transport: UpstreamConfig.Transport
    var tls: Bool
    var httpProtocol: UpstreamProtocol = .http1

    /// `urlsession` cannot trust a test CA on Linux (see TLSClientConfig+Parsing), so HTTPS runs
    /// on `nio`; nor can it speak HTTP/2 (`check` refuses it), so HTTP/2 runs on `nio` too.
    static let all = [ProxyLeg(transport: .urlsession, tls: false), ProxyLeg(transport: .nio, tls: false),
                      ProxyLeg(transport: .nio, tls: true), ProxyLeg(transport: .nio, tls: false, httpProtocol: .http2),
                      ProxyLeg(transport: .nio, tls: true, httpProtocol: .http2)]
    /// Cleartext only: each transport, and `nio` on HTTP/2 (h2c).
    static let plain = all.filter { !$0.tls }

    /// What the upstream speaks for this leg.
    var speaks: TestUpstream.Speaks { httpProtocol == .http1 ? .http1 : .http2 }
    /// The version every request must arrive with.
    var version: String { speaks == .http2 ? "HTTP/2.0" : "HTTP/1.1" }

    var testDescription: String {
        "\(transport.rawValue) over \(tls ? "https" : "http")\(httpProtocol == .http1 ? "" : ", \(httpProtocol.rawValue)")"
    }

    /// Every request `upstream` received came on this leg's protocol.
    func expectArrivals(_ upstream: TestUpstream, sourceLocation: SourceLocation = #_sourceLocation) {
        let versions = Set(upstream.arrivals.map(\.version))
        #expect(versions.isSubset(of: [version]), "requests arrived on \(versions.sorted()), not \(version)",
                sourceLocation: sourceLocation)
    }
}

/// One conformance suite, both transports and TLS, through the real gateway to a real loopback upstream.
@Suite("Proxying through the gateway")
struct ProxyConformanceTests {
    /// A gateway with one prefix route to `upstream` over `leg`.
    static func gateway(_ upstream: TestUpstream, _ leg: ProxyLeg,
                        configure: (inout PorticoConfig) -> Void = { _ in }) async throws -> TestGateway {
        let tls = leg.tls ? try await TestCertificates.shared().trustingCA() : TLSClientConfig()
        return try gateway(baseURL: upstream.baseURL, leg.transport, tls: tls, httpProtocol: leg.httpProtocol, configure: configure)
    }

    /// A gateway with one prefix route to `upstream` over `transport` (for suites reusing this one).
    static func gateway(_ upstream: TestUpstream, _ transport: UpstreamConfig.Transport, tls: TLSClientConfig = TLSClientConfig(),
                        configure: (inout PorticoConfig) -> Void = { _ in }) throws -> TestGateway {
        try gateway(baseURL: upstream.baseURL, transport, tls: tls, configure: configure)
    }

    /// A gateway with one prefix route (`/api` → `/base`) to the plain HTTP upstream on `upstreamPort`.
    static func gateway(upstreamPort: Int, _ transport: UpstreamConfig.Transport,
                        configure: (inout PorticoConfig) -> Void = { _ in }) throws -> TestGateway {
        try gateway(baseURL: URL(string: "http://127.0.0.1:\(upstreamPort)")!, transport, configure: configure)
    }

    /// A gateway with one prefix route (`/api` → `/base`) to the upstream at `baseURL`.
    static func gateway(baseURL: URL, _ transport: UpstreamConfig.Transport, tls: TLSClientConfig = TLSClientConfig(),
                        httpProtocol: UpstreamProtocol = .http1,
                        configure: (inout PorticoConfig) -> Void = { _ in }) throws -> TestGateway {
        var config = PorticoConfig()
        var settings = UpstreamConfig(name: "up", url: baseURL.appendingPathComponent("base"))
        settings.transport = transport
        settings.httpProtocol = httpProtocol
        settings.connectTimeout = .seconds(30)
        settings.tls = tls
        config.upstreams = ["up": settings]
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api"), upstream: "up", stripPrefix: true)]
        configure(&config)
        return try TestGateway(config)
    }

    /// A started upstream: plain HTTP, or HTTPS with the test CA's server certificate for a TLS leg.
    static func started(_ leg: ProxyLeg = ProxyLeg(transport: .nio, tls: false)) async throws -> TestUpstream {
        let upstream: TestUpstream
        if leg.tls {
            let certificates = try await TestCertificates.shared()
            upstream = TestUpstream(tls: try certificates.serverTLS(certificates.server), speaking: leg.speaks)
        } else {
            upstream = TestUpstream(speaking: leg.speaks)
        }
        try await upstream.start()
        return upstream
    }

    @Test("every method, its body and the raw target reach the upstream", arguments: ProxyLeg.all)
    func methods(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        let gateway = try await Self.gateway(upstream, leg)
        for method in ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            let body: [UInt8] = method == "GET" || method == "OPTIONS" || method == "DELETE" ? [] : Array("payload-\(method)".utf8)
            let response = try await gateway.request(method, "/api/items/a%2Fb?q=1+2&q=%2F&u=%E2%82%AC", body: body)
            #expect(response.status == 200, "\(method)")
            let echo = try TestUpstream.Echo.decode(response.body)
            #expect(echo.method == method)
            #expect(echo.target == "/base/items/a%2Fb?q=1+2&q=%2F&u=%E2%82%AC")
            #expect(echo.bodyBytes == body)
            #expect(echo.version == leg.version)
        }
        let head = try await gateway.request("HEAD", "/api/items")
        #expect(head.status == 200)
        #expect(head.body.isEmpty)
        #expect(Int(head.header("content-length") ?? "") ?? 0 > 0)
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("binary bodies up to the limit arrive byte for byte", arguments: ProxyLeg.all)
    func binaryBodies(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        upstream.route("/base/raw") { request in TestUpstream.Response(status: 200, body: request.body) }
        let gateway = try await Self.gateway(upstream, leg) { $0.listen.maxBodyBytes = 4 * 1024 * 1024 }
        for size in [0, 1, 65_535, 1_000_003, 4 * 1024 * 1024] {
            let body = RandomBytes.make(size)
            let response = try await gateway.request("POST", "/api/raw", body: body)
            #expect(response.status == 200)
            if let difference = ByteDifference(response.body, expected: body) { Issue.record("size \(size): \(difference)") }
        }
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("hop-by-hop headers are dropped, forwarding headers added, the client's headers kept",
          arguments: ProxyLeg.all)
    func headerHygiene(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        let gateway = try await Self.gateway(upstream, leg)
        let response = try await gateway.request("GET", "/api/h", headers: [
            ("Connection", "keep-alive, X-Secret-Hop"), ("X-Secret-Hop", "1"), ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"), ("Proxy-Authorization", "Basic eDp5"), ("X-Keep", "yes"), ("User-Agent", "portico-test/1"),
        ])
        let echo = try TestUpstream.Echo.decode(response.body)
        for dropped in ["x-secret-hop", "keep-alive", "te", "proxy-authorization", "connection"] {
            #expect(!echo.headerNames.contains(dropped), "\(dropped) reached the upstream")
        }
        #expect(echo.values("x-keep") == ["yes"])
        #expect(echo.values("user-agent") == ["portico-test/1"])
        #expect(echo.values("x-forwarded-for") == ["127.0.0.1"])
        #expect(echo.values("x-forwarded-proto") == ["http"])
        #expect(echo.values("x-forwarded-host") == ["gateway.test"])
        #expect(echo.values("via").first?.contains("portico") == true)
        #expect(echo.values("host") == ["127.0.0.1:\(upstream.port)"])
        #expect(echo.values("x-request-id").count == 1)
        // FoundationNetworking adds none of its own headers.
        #expect(!echo.headerNames.contains("accept-language"))
        #expect(!echo.headerNames.contains("accept"))
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("duplicate response headers reach the client; Set-Cookie stays separate", arguments: ProxyLeg.all)
    func duplicateResponseHeaders(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        upstream.route("/base/cookies", TestUpstream.Response(status: 200, headers: [
            ("Set-Cookie", "a=1; Path=/; Expires=Wed, 21 Oct 2037 07:28:00 GMT"), ("Set-Cookie", "b=2; HttpOnly"),
        ], body: "ok"))
        let gateway = try await Self.gateway(upstream, leg)
        let response = try await gateway.request("GET", "/api/cookies")
        #expect(response.headers("set-cookie").sorted() == ["a=1; Path=/; Expires=Wed, 21 Oct 2037 07:28:00 GMT", "b=2; HttpOnly"])
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("redirects are passed through, not followed", arguments: ProxyLeg.all)
    func redirects(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        for status in [301, 302, 307] {
            upstream.route("/base/r\(status)", .redirect(status, location: "/elsewhere"))
        }
        let gateway = try await Self.gateway(upstream, leg)
        for status in [301, 302, 307] {
            let response = try await gateway.request("GET", "/api/r\(status)")
            #expect(response.status == status)
            #expect(response.header("location") == "/elsewhere")
        }
        #expect(upstream.hits("/elsewhere") == 0)
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("gzip bodies stay consistent with their headers", arguments: ProxyLeg.all)
    func gzip(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        let plain = Array(String(repeating: "{\"hello\":\"world\"}", count: 500).utf8)
        upstream.route("/base/z", .gzip(plain, headers: [("Content-Type", "application/json")]))
        let gateway = try await Self.gateway(upstream, leg)
        let response = try await gateway.request("GET", "/api/z", headers: [("Accept-Encoding", "gzip")])
        #expect(response.status == 200)
        #expect(response.header("content-encoding") == "gzip")
        #expect(Int(response.header("content-length") ?? "") == response.body.count)
        #expect(try Zlib.decompress(response.body, limit: 1 << 20) == plain)
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("204 and 304 come back without a body", arguments: ProxyLeg.all)
    func noBody(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        upstream.route("/base/none", .noContent)
        upstream.route("/base/same", .notModified(etag: "\"v1\""))
        let gateway = try await Self.gateway(upstream, leg)
        let connection = try gateway.connect()
        try await connection.send("GET /api/none HTTP/1.1\r\nHost: x\r\n\r\nGET /api/same HTTP/1.1\r\nHost: x\r\n\r\nGET /api/x HTTP/1.1\r\nHost: x\r\n\r\n")
        let noContent = try #require(try await connection.readResponse())
        #expect(noContent.status == 204)
        let notModified = try #require(try await connection.readResponse())
        #expect(notModified.status == 304)
        #expect(notModified.header("etag") != nil)
        // The connection stays usable: nothing stray was sent after the bodiless answers.
        let next = try #require(try await connection.readResponse())
        #expect(next.status == 200)
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("a 401 with a Basic challenge comes back promptly", arguments: ProxyLeg.all)
    func basicChallenge(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        upstream.route("/base/private", .basicChallenge(realm: "x"))
        // A hang (URLSession waiting on a credential) would end in the 90 s deadline's 504.
        let gateway = try await Self.gateway(upstream, leg) { $0.listen.requestTimeout = .seconds(90) }
        let started = ContinuousClock.now
        let response = try await gateway.request("GET", "/api/private")
        #expect(response.status == 401)
        #expect(response.header("www-authenticate")?.hasPrefix("Basic") == true)
        #expect(ContinuousClock.now - started < .seconds(60), "answered by the upstream, not by a timeout")
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("a silent upstream becomes a JSON 504 within the deadline", arguments: ProxyLeg.all)
    func slowUpstream(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        upstream.route("/base/slow", .never)
        let gateway = try await Self.gateway(upstream, leg) { $0.routes[0].timeout = .milliseconds(400) }
        let started = ContinuousClock.now
        let response = try await gateway.request("GET", "/api/slow")
        #expect(response.status == 504)
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        #expect(body.error == "upstream_timeout")
        #expect(ContinuousClock.now - started < .seconds(30))  // .never would hang until the 30 s listener deadline + grace
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("an upstream closing mid-body, or one that is down, becomes a JSON 502", arguments: ProxyLeg.all)
    func brokenUpstream(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        upstream.route("/base/cut", .truncated(declaredLength: 10_000, body: Array(repeating: 0x41, count: 100)))
        let gateway = try await Self.gateway(upstream, leg)
        let cut = try await gateway.request("GET", "/api/cut")
        #expect(cut.status == 502)
        #expect(try JSONDecoder().decode(ErrorBody.self, from: Data(cut.body)).error == "upstream_unavailable")
        leg.expectArrivals(upstream)
        await upstream.shutdown()
        let down = try await gateway.request("GET", "/api/anything")
        #expect(down.status == 502)
        #expect(try JSONDecoder().decode(ErrorBody.self, from: Data(down.body)).error == "upstream_unavailable")
        await gateway.stop()
    }

    @Test("200 concurrent requests with distinct bodies each get their own answer", arguments: ProxyLeg.all)
    func concurrency(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        upstream.route("/base/mirror") { request in TestUpstream.Response(status: 200, body: request.body) }
        let gateway = try await Self.gateway(upstream, leg)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for index in 0..<200 {
                group.addTask {
                    let body = Array("request-\(index)-".utf8) + Array(repeating: UInt8(index % 256), count: index * 10)
                    let response = try await gateway.request("POST", "/api/mirror", body: body)
                    #expect(response.status == 200)
                    if let difference = ByteDifference(response.body, expected: body) { Issue.record("request \(index): \(difference)") }
                }
            }
            try await group.waitForAll()
        }
        if leg.httpProtocol == .http2 {
            // connections_per_loop 1 × the gateway's two threads; each has room for 100 streams.
            let connections = Set(upstream.arrivals.map(\.connection))
            #expect(connections.count <= 2, "200 requests over \(connections.count) HTTP/2 connections")
        }
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("HTTP/2: requests in flight together share one connection per gateway thread",
          arguments: ProxyLeg.all.filter { $0.httpProtocol == .http2 })
    func multiplexing(leg: ProxyLeg) async throws {
        let upstream = try await Self.started(leg)
        let gate = AsyncGate()
        upstream.route("/base/held") { _ in
            await gate.wait()
            return .text("released\n")
        }
        let gateway = try await Self.gateway(upstream, leg)
        let count = 20
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<count {
                group.addTask {
                    let response = try await gateway.request("GET", "/api/held")
                    #expect(response.status == 200)
                }
            }
            // Every request is held upstream at once before any is answered.
            try await Eventually.wait(timeout: .seconds(60), "all \(count) requests held upstream") { upstream.hits("/base/held") == count }
            gate.open()
            try await group.waitForAll()
        }
        // Each of the gateway's two threads has its own pool: one connection each, all streams on them.
        #expect(upstream.connections.accepted <= 2, "connections: \(upstream.connections.accepted)")
        #expect(upstream.peakStreams >= count / 2, "most streams at once on one connection: \(upstream.peakStreams)")
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("max_connections below listen.threads: every loop's requests are answered, none waits for a connection another loop holds idle",
          arguments: [UpstreamProtocol.http1, .http2])
    func capBelowThreads(httpProtocol: UpstreamProtocol) async throws {
        let leg = ProxyLeg(transport: .nio, tls: false, httpProtocol: httpProtocol)
        let upstream = try await Self.started(leg)
        let gateway = try await Self.gateway(upstream, leg) { config in
            config.upstreams["up"]?.maxConnections = 1
            config.upstreams["up"]?.connectTimeout = .seconds(2)
        }
        // One connection for two threads. HTTP/1.1's pool asks another loop to close its idle
        // connection when a request waits at the cap (`closeIdleForOtherLoop`); HTTP/2's sends the
        // second loop's requests to the loop that holds the connection (before, they waited the
        // connect timeout out: 504 upstream_timeout).
        // Each new client connection goes to the next of the gateway's two threads in turn.
        for index in 0..<4 {
            let response = try await gateway.request("GET", "/api/turn\(index)")
            #expect(response.status == 200, "request \(index): \(response.status) \(response.bodyText)")
        }
        leg.expectArrivals(upstream)
        await gateway.stop()
        await upstream.shutdown()
    }
}
