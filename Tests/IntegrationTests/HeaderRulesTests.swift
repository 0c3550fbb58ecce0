import Foundation
import Portico
import PorticoTesting
import Testing

/// `type: headers` and `host_header` in the real gateway, loaded from YAML as a user writes it,
/// against real loopback servers on both transports.
@Suite("Header rules through the gateway")
struct HeaderRulesIntegrationTests {
    /// A gateway for `yaml` (its upstream URL is `upstreamURL`), loaded with `environment`.
    static func gateway(_ yaml: String, environment: [String: String] = [:]) throws -> TestGateway {
        let config = try ConfigLoader.load(yaml: yaml, source: "portico.yaml", environment: environment)
        return try TestGateway(config)
    }

    static func yaml(upstream: URL, transport: UpstreamConfig.Transport, upstreamExtra: String = "",
                     middleware: String, chain: String) -> String {
        """
        upstreams:
          up: { url: "\(upstream.absoluteString)/base", transport: \(transport.rawValue)\(upstreamExtra) }
        middleware:
        \(middleware)
        routes:
          - name: api
            match: { path_prefix: /api }
            upstream: up
            strip_prefix: true
            middleware: [\(chain)]
        """
    }

    static let stamp = """
          stamp:
            type: headers
            request:
              remove: [X-Debug]
              set: { X-Request-Tag: "id=${request_id} ip=${client_ip}", X-Api-Key: "${env:ORDERS_KEY}" }
              add: { X-Hop: "${route}->${upstream}" }
            response:
              remove: [Server, X-Internal]
              set: { X-Served-By: "portico/${route}" }
              add: { X-Request-Echo: "${request_id}" }
        """

    @Test("the upstream sees set, added and removed fields with resolved values; the client sees the response rules",
          arguments: UpstreamConfig.Transport.allCases)
    func requestAndResponseRules(transport: UpstreamConfig.Transport) async throws {
        let upstream = TestUpstream()
        try await upstream.start()
        upstream.route("/base/plain", TestUpstream.Response(
            headers: [("Server", "test/1"), ("X-Internal", "secret-host"), ("Content-Type", "text/plain")], body: "ok"))
        let gateway = try Self.gateway(Self.yaml(upstream: upstream.baseURL, transport: transport, middleware: Self.stamp, chain: "stamp"),
                                       environment: ["ORDERS_KEY": "k-123"])
        let response = try await gateway.request("GET", "/api/echo", headers: [
            ("X-Request-ID", "req-abc"), ("X-Debug", "1"), ("X-Request-Tag", "from-client"), ("X-Hop", "client-hop"),
        ])
        #expect(response.status == 200)
        let echo = try TestUpstream.Echo.decode(response.body)
        #expect(echo.values("X-Debug") == [])
        #expect(echo.values("X-Request-Tag") == ["id=req-abc ip=127.0.0.1"])
        #expect(echo.values("X-Api-Key") == ["k-123"])
        #expect(echo.values("X-Hop").joined(separator: ", ") == "client-hop, api->up")
        // Hygiene still ran after the rules.
        #expect(echo.values("Host") == ["127.0.0.1:\(upstream.port)"])
        #expect(echo.values("X-Forwarded-For") == ["127.0.0.1"])
        #expect(response.header("x-served-by") == "portico/api")
        #expect(response.header("x-request-echo") == "req-abc")

        let plain = try await gateway.request("GET", "/api/plain")
        #expect(plain.status == 200)
        #expect(plain.bodyText == "ok")
        #expect(plain.header("server") == nil)
        #expect(plain.header("x-internal") == nil)
        #expect(plain.header("x-served-by") == "portico/api")
        #expect(plain.header("x-request-echo")?.isEmpty == false)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("a cache hit behind the rules is still served without the upstream, with the response rules applied per request",
          arguments: UpstreamConfig.Transport.allCases)
    func cacheHit(transport: UpstreamConfig.Transport) async throws {
        let upstream = TestUpstream()
        try await upstream.start()
        upstream.route("/base/item", TestUpstream.Response(headers: [("Cache-Control", "max-age=600"), ("Server", "test/1")], body: "item"))
        let middleware = Self.stamp + "\n  cache: { type: cache }"
        let gateway = try Self.gateway(Self.yaml(upstream: upstream.baseURL, transport: transport, middleware: middleware, chain: "stamp, cache"),
                                       environment: ["ORDERS_KEY": "k"])
        let first = try await gateway.request("GET", "/api/item", headers: [("X-Request-ID", "first")])
        #expect(first.header("x-request-echo") == "first")
        let second = try await gateway.request("GET", "/api/item", headers: [("X-Request-ID", "second")])
        #expect(second.bodyText == "item")
        #expect(second.header("cache-status")?.contains("hit") == true)
        #expect(second.header("x-request-echo") == "second")
        #expect(second.header("x-served-by") == "portico/api")
        #expect(second.header("server") == nil)
        #expect(upstream.hits("/base/item") == 1)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("host_header sends another Host on both transports; X-Forwarded-Host stays the client's",
          arguments: UpstreamConfig.Transport.allCases)
    func hostHeader(transport: UpstreamConfig.Transport) async throws {
        let upstream = TestUpstream()
        try await upstream.start()
        let yaml = Self.yaml(upstream: upstream.baseURL, transport: transport, upstreamExtra: ", host_header: \"orders.internal:8443\"",
                             middleware: "  none: { type: headers, response: { set: { X-A: a } } }", chain: "none")
        let gateway = try Self.gateway(yaml)
        let response = try await gateway.request("GET", "/api/echo", headers: [])
        let echo = try TestUpstream.Echo.decode(response.body)
        #expect(echo.values("Host") == ["orders.internal:8443"])
        #expect(echo.values("X-Forwarded-Host") == ["gateway.test"])
        await gateway.stop()
        await upstream.shutdown()
    }

    /// `urlsession` cannot trust the test CA on Linux, so HTTPS runs on `nio` (as in ProxyConformanceTests).
    @Test("host_header over HTTPS on nio: the Host changes, the certificate is still checked against the URL's host")
    func hostHeaderTLS() async throws {
        let upstream = try await ProxyConformanceTests.started(ProxyLeg(transport: .nio, tls: true))
        let gateway = try await ProxyConformanceTests.gateway(upstream, ProxyLeg(transport: .nio, tls: true)) { config in
            config.upstreams["up"]?.hostHeader = "orders.internal"
        }
        let response = try await gateway.request("GET", "/api/echo")
        #expect(response.status == 200)
        #expect(try TestUpstream.Echo.decode(response.body).values("Host") == ["orders.internal"])
        await gateway.stop()
        await upstream.shutdown()
    }
}

/// The same rules against nginx, which reports what it received in its own words.
@Suite("Header rules against nginx", .enabled(if: ExternalServer.available("nginx"), "needs nginx (scripts/test installs it)"))
struct HeaderRulesNginxTests {
    @Test("nginx sees the rules' fields and the host_header Host", arguments: UpstreamConfig.Transport.allCases)
    func nginx(transport: UpstreamConfig.Transport) async throws {
        let server = try await ExternalServer.nginx(serverBlock: """
            location /echo {
              default_type text/plain;
              add_header X-Upstream-Only yes;
              return 200 "host=$http_host tag=$http_x_request_tag key=$http_x_api_key debug=[$http_x_debug]\\n";
            }
            """)
        defer { server.stop() }
        let yaml = """
            upstreams:
              nginx: { url: "http://127.0.0.1:\(server.port)", transport: \(transport.rawValue), host_header: vhost.test }
            middleware:
              stamp:
                type: headers
                request: { set: { X-Request-Tag: "${request_id}@${route}", X-Api-Key: "${env:KEY}" }, remove: [X-Debug] }
                response: { remove: [X-Upstream-Only], set: { X-Route: "${route}" } }
            routes:
              - { name: all, match: { path_prefix: / }, upstream: nginx, middleware: [stamp] }
            """
        let gateway = try HeaderRulesIntegrationTests.gateway(yaml, environment: ["KEY": "nginx-key"])
        let response = try await gateway.request("GET", "/echo", headers: [("X-Request-ID", "rid-7"), ("X-Debug", "on")])
        #expect(response.status == 200)
        #expect(response.bodyText == "host=vhost.test tag=rid-7@all key=nginx-key debug=[]\n")
        #expect(response.header("x-upstream-only") == nil)
        #expect(response.header("x-route") == "all")
        await gateway.stop()
    }
}

/// `portico check` itself on a file with header-rule and pin mistakes: every one reported, with
/// file, line and key path, exit status 1, and no environment value printed.
@Suite("portico check: header rules and pins")
struct HeaderRulesCheckCommandTests {
    @Test("framed fields, an unknown reference, a missing variable and a short pin are all refused")
    func check() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the portico product first")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-check-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("portico.yaml")
        try """
            upstreams:
              app: { url: "https://127.0.0.1:9443", transport: nio, tls: { pin_sha256: ["AAAA"] } }
              old: { url: "https://127.0.0.1:9444", tls: { pin_sha256: ["\(Data(repeating: 1, count: 32).base64EncodedString())"] } }
            middleware:
              stamp:
                type: headers
                request: { set: { Host: other.test, X-Key: "${env:PORTICO_TEST_SECRET}", X-Id: "${requestid}" } }
                response: { remove: [Transfer-Encoding], add: { X-Missing: "${env:PORTICO_TEST_UNSET}" } }
            routes:
              - { name: api, match: { path_prefix: / }, upstream: app, middleware: [stamp] }
            """.write(to: file, atomically: true, encoding: .utf8)
        let output = directory.appendingPathComponent("out").path
        let process = try ChildProcess(
            executable: ChildProcess.locate("env") ?? "/usr/bin/env",
            arguments: ["-u", "PORTICO_TEST_UNSET", "PORTICO_TEST_SECRET=do-not-print-me", CommandTests.binary, "check", "--config", file.path],
            standardOutput: .file(output), standardError: .file(output))
        let status = await process.waitForExit(timeout: .seconds(60))
        if status == nil { await process.terminate() }
        let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        #expect(status == 1, "\(text)")
        for expected in [
            "portico.yaml:2 upstreams.app.tls.pin_sha256[0]: expected the base64 of a 32-byte SHA-256 digest",
            "portico.yaml:3 upstreams.old.tls.pin_sha256: the urlsession transport on Linux cannot pin a certificate key",
            "portico.yaml:7 middleware.stamp.request.set.Host: \"Host\" cannot be changed by a header rule: to send another Host to the upstream, set host_header: on the upstream",
            "portico.yaml:7 middleware.stamp.request.set.X-Id: unknown reference \"${requestid}\"",
            "portico.yaml:8 middleware.stamp.response.remove[0]: \"Transfer-Encoding\" cannot be changed by a header rule",
            "portico.yaml:8 middleware.stamp.response.add.X-Missing: environment variable \"PORTICO_TEST_UNSET\" is not set",
        ] {
            #expect(text.contains(expected), "missing \(expected) in:\n\(text)")
        }
        #expect(!text.contains("do-not-print-me"))
    }
}
