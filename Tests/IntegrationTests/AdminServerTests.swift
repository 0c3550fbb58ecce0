import Foundation
import Logging
import Portico
import PorticoTesting
import Testing

@Suite("Admin listener")
struct AdminServerTests {
    static func yaml(body: String) -> String {
        """
        listen: { address: 127.0.0.1, port: 0 }
        admin: { address: 127.0.0.1, port: 0 }
        routes:
          - name: version
            match: { path: /version }
            direct: { status: 200, body: "\(body)" }
        """
    }

    @Test("healthz, readyz and metrics answer; POST /-/reload swaps a valid file and refuses a broken one; readyz turns 503 on drain")
    func adminEndpoints() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("portico-admin-\(UUID().uuidString).yaml")
        defer { try? FileManager.default.removeItem(at: file) }
        try Self.yaml(body: "one").write(to: file, atomically: true, encoding: .utf8)
        let config = try ConfigLoader.load(file: file.path)
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        let server = try GatewayServer(config: config, configFile: file.path, logger: logger)
        let port = Int(try server.start())
        let admin = AdminServer(config: config.admin, gateway: server, logger: logger) { Array("portico_test_metric 1\n".utf8) }
        let adminPort = Int(try admin.start())

        func call(_ method: String, _ target: String, port: Int) async throws -> RawHTTPResponse {
            let connection = try RawHTTPConnection(port: port)
            try await connection.send("\(method) \(target) HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            return try #require(try await connection.readResponse(forHead: method == "HEAD"))
        }

        #expect(try await call("GET", "/healthz", port: adminPort).status == 200)
        #expect(try await call("GET", "/readyz", port: adminPort).status == 200)
        let metrics = try await call("GET", "/metrics", port: adminPort)
        #expect(metrics.header("content-type")?.hasPrefix("text/plain; version=0.0.4") == true)
        #expect(metrics.bodyText == "portico_test_metric 1\n")
        #expect(try await call("GET", "/version", port: port).bodyText == "one")
        // The admin paths are not on the proxy port.
        #expect(try await call("GET", "/metrics", port: port).status == 404)

        // A broken file is refused with its errors; the old configuration keeps serving.
        try "routes:\n  - name: version\n    match: { path: /version }\n    upstream: nowhere\n".write(to: file, atomically: true, encoding: .utf8)
        let refused = try await call("POST", "/-/reload", port: adminPort)
        #expect(refused.status == 400)
        #expect(refused.bodyText.contains("routes[0].upstream: unknown upstream \"nowhere\""))
        #expect(try await call("GET", "/version", port: port).bodyText == "one")

        // A valid file is swapped in.
        try Self.yaml(body: "two").write(to: file, atomically: true, encoding: .utf8)
        #expect(try await call("POST", "/-/reload", port: adminPort).status == 200)
        #expect(try await call("GET", "/version", port: port).bodyText == "two")
        #expect(try await call("GET", "/-/reload", port: adminPort).status == 405)

        async let stopped: Void = server.shutdown(drainDelay: .seconds(1), grace: .seconds(5))
        try await Eventually.wait { server.isDraining }
        #expect(try await call("GET", "/readyz", port: adminPort).status == 503)
        await stopped
        await admin.stop()
    }
}
