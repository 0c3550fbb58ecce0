import Foundation
import Logging
import Portico
import PorticoTesting
import Testing

/// The admin listener's JSON endpoints, the dashboard page and the token, against a real gateway.
@Suite("Admin endpoints: routes, explain, credentials, stats, dashboard, token")
struct AdminEndpointsTests {
    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    static func yaml(admin: String = "admin: { address: 127.0.0.1, port: 0 }", tokenURL: String, extraRoute: String = "") -> String {
        """
        listen: { address: 127.0.0.1, port: 0 }
        \(admin)
        upstreams:
          api: { url: "http://127.0.0.1:9/base" }
        credentials:
          idp: { type: oauth2_client_credentials, token_url: "\(tokenURL)", client_id: portico, client_secret: test-client-secret }
        middleware:
          auth: { type: auth, credential: idp }
          cache: { type: cache }
        routes:
          - name: version
            match: { path: /version }
            direct: { status: 200, body: one }
          - name: api
            match: { path_prefix: /api, methods: [GET] }
            upstream: api
            strip_prefix: true
            middleware: [cache, auth]
        \(extraRoute)
        """
    }

    /// A gateway from `yaml` in a file (so reload works) and its admin listener.
    struct Running {
        let file: URL
        let server: GatewayServer
        let admin: AdminServer
        var adminPort: Int { Int(admin.port) }

        init(_ yaml: String, metrics: @escaping @Sendable () -> [UInt8] = { [] }) throws {
            file = FileManager.default.temporaryDirectory.appendingPathComponent("portico-admin-\(UUID().uuidString).yaml")
            try yaml.write(to: file, atomically: true, encoding: .utf8)
            let config = try ConfigLoader.load(file: file.path, environment: ["ADMIN_TOKEN": "t0ken-for-tests"])
            server = try GatewayServer(config: config, configFile: file.path, logger: AdminEndpointsTests.logger)
            try server.start()
            admin = AdminServer(config: config.admin, gateway: server, logger: AdminEndpointsTests.logger, metricsText: metrics)
            try admin.start()
        }

        func get(_ target: String, method: String = "GET", headers: [(String, String)] = []) async throws -> RawHTTPResponse {
            let connection = try RawHTTPConnection(port: adminPort)
            var head = "\(method) \(target) HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\n"
            for (name, value) in headers { head += "\(name): \(value)\r\n" }
            try await connection.send(head + "\r\n")
            return try #require(try await connection.readResponse())
        }

        func json(_ target: String, headers: [(String, String)] = []) async throws -> [String: Any] {
            let response = try await get(target, headers: headers)
            #expect(response.status == 200, "\(target): \(response.bodyText)")
            #expect(response.header("content-type") == "application/json")
            return try #require(try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])
        }

        func stop() async {
            await server.shutdown(drainDelay: .zero, grace: .seconds(1))
            await admin.stop()
            try? FileManager.default.removeItem(at: file)
        }
    }

    @Test("GET /routes lists the table; GET /explain answers from the live configuration, the new one after a reload")
    func routesAndExplain() async throws {
        let gateway = try Running(Self.yaml(tokenURL: "http://127.0.0.1:9/token"))
        let table = try await gateway.json("/routes")
        let routes = try #require(table["routes"] as? [[String: Any]])
        #expect(routes.map { $0["name"] as? String } == ["version", "api"])
        let api = try #require(routes.last)
        #expect(api["answers_at_once"] as? [String] == ["cache: a fresh stored response (hit)"])
        #expect((api["chain"] as? [[String: Any]])?.map { $0["type"] as? String } == ["cache", "auth"])

        let url = "http%3A%2F%2Fexample.test%2Fapi%2Fitems%3Fq%3D1"
        let explained = try await gateway.json("/explain?method=GET&url=\(url)&header=Accept-Encoding:gzip")
        #expect(explained["outcome"] as? String == "route api")
        #expect(explained["upstream_url"] as? String == "http://127.0.0.1:9/base/items?q=1")
        let chain = try #require(explained["chain"] as? [[String: Any]])
        #expect(chain.first?["action"] as? String == "would look up key \"example.test/api/items?q=1\": 0 stored variants now")
        #expect((chain.last?["action"] as? String)?.hasPrefix("sets Authorization from credential idp") == true)
        let post = try await gateway.json("/explain?method=POST&url=%2Fapi%2Fx")
        #expect(post["outcome"] as? String == "no route allows the method: 405 method_not_allowed (Allow: GET)")
        #expect(try await gateway.get("/explain").status == 400)
        #expect(try await gateway.get("/explain?url=ftp%3A%2F%2Fx").bodyText.contains("is not a URL"))

        try Self.yaml(tokenURL: "http://127.0.0.1:9/token", extraRoute: """
              - name: added
                match: { path: /added }
                direct: { status: 204 }
            """).write(to: gateway.file, atomically: true, encoding: .utf8)
        #expect(try await gateway.get("/-/reload", method: "POST").status == 200)
        #expect(try await gateway.json("/explain?url=%2Fadded")["outcome"] as? String == "route added")
        let stats = try await gateway.json("/stats")
        #expect((stats["last_reload"] as? [String: Any])?["ok"] as? Bool == true)
        await gateway.stop()
    }

    @Test("GET /credentials: a failing IdP shows its error, the failures and the next attempt, never a secret")
    func credentials() async throws {
        let idp = try TestTokenEndpoint()
        let gateway = try Running(Self.yaml(tokenURL: idp.url.absoluteString))
        var report = try await gateway.json("/credentials")
        var entry = try #require((report["credentials"] as? [[String: Any]])?.first)
        #expect(entry["name"] as? String == "idp" && entry["kind"] as? String == "oauth2_client_credentials")
        #expect(entry["has_token"] as? Bool == false && entry["last_refresh"] == nil)

        try await idp.setFailure(.status(500))
        let response = try await TestGatewayRequest.send(port: Int(gateway.server.port), "/api/x")
        #expect(response.status == 503)
        report = try await gateway.json("/credentials")
        entry = try #require((report["credentials"] as? [[String: Any]])?.first)
        #expect(entry["consecutive_failures"] as? Int == 1)
        let last = try #require(entry["last_refresh"] as? [String: Any])
        #expect(last["ok"] as? Bool == false)
        #expect((last["error"] as? String)?.contains("500") == true)
        #expect(entry["next_attempt_in_seconds"] is Double)
        #expect(!String(describing: report).contains("test-client-secret"))
        await gateway.stop()
        await idp.stop()
    }

    @Test("GET /stats summarises the metrics text; GET / is one self-contained page")
    func statsAndDashboard() async throws {
        let exposition = Array("""
            portico_requests_total{route="version",method="GET",code="200"} 4
            portico_cache_hits_total{cache="cache"} 1
            portico_cache_misses_total{cache="cache"} 3

            """.utf8)
        let gateway = try Running(Self.yaml(tokenURL: "http://127.0.0.1:9/token"), metrics: { exposition })
        let stats = try await gateway.json("/stats")
        let routes = try #require(stats["routes"] as? [[String: Any]])
        #expect(routes.map { $0["name"] as? String } == ["version", "api"])
        #expect(routes.first?["requests_total"] as? Double == 4)
        #expect((stats["caches"] as? [[String: Any]])?.first?["hit_ratio"] as? Double == 0.25)

        let page = try await gateway.get("/")
        #expect(page.status == 200 && page.header("content-type") == "text/html; charset=utf-8")
        #expect(page.header("content-security-policy")?.hasPrefix("default-src 'none'") == true)
        let html = page.bodyText
        #expect(html.hasPrefix("<!doctype html>") && html.contains("fetch(path"))
        // Nothing loaded from elsewhere: no external scripts, styles, fonts or images.
        for external in ["<script src", "@import", "url(", "src=\"http", "href=\"http"] { #expect(!html.contains(external), "\(external)") }
        // The Limits panel reads /limits; with no limit configured it answers empty lists.
        #expect(html.contains("get(\"/limits\")") && html.contains("<h2>Limits</h2>"))
        for table in ["limit-rates", "limit-providers", "limit-quotas"] { #expect(html.contains("<table id=\"\(table)\""), "\(table)") }
        let limits = try await gateway.json("/limits")
        #expect((limits["rate_limits"] as? [Any])?.isEmpty == true && (limits["provider_limits"] as? [Any])?.isEmpty == true
                && (limits["quotas"] as? [Any])?.isEmpty == true, "\(limits)")
        #expect(try await gateway.get("/limits", method: "POST").status == 405)
        #expect(try await gateway.get("/", method: "POST").status == 405)
        await gateway.stop()
    }

    @Test("with admin.token: 401 JSON without the bearer, 200 with it; probes and the page stay open")
    func token() async throws {
        let gateway = try Running(Self.yaml(admin: "admin: { address: 127.0.0.1, port: 0, token: \"${ADMIN_TOKEN}\" }",
                                            tokenURL: "http://127.0.0.1:9/token"))
        for path in ["/routes", "/credentials", "/stats", "/limits", "/explain?url=%2Fversion", "/metrics"] {
            let refused = try await gateway.get(path)
            #expect(refused.status == 401, "\(path)")
            #expect(refused.header("content-type") == "application/json")
            #expect(refused.header("www-authenticate") == "Bearer realm=\"portico-admin\"")
            #expect(refused.bodyText.contains("\"error\":\"unauthorized\""))
            #expect(try await gateway.get(path, headers: [("Authorization", "Bearer wrong")]).status == 401)
            #expect(try await gateway.get(path, headers: [("Authorization", "Bearer t0ken-for-tests")]).status == 200, "\(path)")
        }
        #expect(try await gateway.get("/-/reload", method: "POST").status == 401)
        for path in ["/healthz", "/readyz", "/"] { #expect(try await gateway.get(path).status == 200, "\(path)") }
        await gateway.stop()
    }
}

/// One request to the proxy listener.
enum TestGatewayRequest {
    static func send(port: Int, _ target: String) async throws -> RawHTTPResponse {
        let connection = try RawHTTPConnection(port: port)
        try await connection.send("GET \(target) HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        return try #require(try await connection.readResponse())
    }
}
