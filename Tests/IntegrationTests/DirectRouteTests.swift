import Foundation
import Portico
import PorticoTesting
import Testing

/// A config with direct routes only: exercises server, router and error shape without an upstream.
func directConfig() -> PorticoConfig {
    var config = PorticoConfig()
    config.listen.maxBodyBytes = 10 * 1024 * 1024
    config.routes = [
        RouteConfig(name: "ping", match: .init(path: "/ping"),
                    direct: .init(status: 200, body: "pong\n", headers: [("content-type", "text/plain"), ("x-a", "1"), ("x-a", "2")])),
        RouteConfig(name: "upload", match: .init(path: "/upload", methods: ["POST"]),
                    direct: .init(status: 201, body: "stored\n")),
        RouteConfig(name: "teapot", match: .init(path_prefix: "/tea"), direct: .init(status: 418, body: "short and stout\n")),
    ]
    return config
}

private extension RouteConfig.Match {
    init(path_prefix: String) { self.init(pathPrefix: path_prefix) }
}

struct ErrorBody: Decodable {
    var error: String
    var message: String
    var request_id: String
}

@Suite("Direct routes through the real gateway")
struct DirectRouteTests {
    @Test("a direct route answers with its status, headers (duplicates kept) and body")
    func direct() async throws {
        let gateway = try TestGateway(directConfig())
        defer { Task { await gateway.stop() } }
        let response = try await gateway.request("GET", "/ping")
        #expect(response.status == 200)
        #expect(response.bodyText == "pong\n")
        #expect(response.headers("x-a") == ["1", "2"])
        #expect(response.header("content-length") == "5")
        #expect(response.header("x-request-id")?.count == 32)
        let tea = try await gateway.request("GET", "/tea/cup")
        #expect(tea.status == 418)
    }

    @Test("HEAD gets the headers and length without a body")
    func head() async throws {
        let gateway = try TestGateway(directConfig())
        defer { Task { await gateway.stop() } }
        let response = try await gateway.request("HEAD", "/ping")
        #expect(response.status == 200)
        #expect(response.header("content-length") == "5")
        #expect(response.body.isEmpty)
    }

    @Test("an unknown path gets a JSON 404 carrying the request id")
    func notFound() async throws {
        let gateway = try TestGateway(directConfig())
        defer { Task { await gateway.stop() } }
        let response = try await gateway.request("GET", "/nowhere", headers: [("X-Request-ID", "abc-123")])
        #expect(response.status == 404)
        #expect(response.header("content-type") == "application/json")
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        #expect(body.error == "not_found")
        #expect(body.request_id == "abc-123")
        #expect(response.header("x-request-id") == "abc-123")
    }

    @Test("a malformed X-Request-ID is replaced by a generated one")
    func malformedRequestID() async throws {
        let gateway = try TestGateway(directConfig())
        defer { Task { await gateway.stop() } }
        let response = try await gateway.request("GET", "/ping", headers: [("X-Request-ID", "bad id with spaces {}")])
        let id = try #require(response.header("x-request-id"))
        #expect(id != "bad id with spaces {}")
        #expect(RequestID.isWellFormed(id))
    }

    @Test("a wrong method gets 405 with Allow")
    func methodNotAllowed() async throws {
        let gateway = try TestGateway(directConfig())
        defer { Task { await gateway.stop() } }
        let response = try await gateway.request("GET", "/upload")
        #expect(response.status == 405)
        #expect(response.header("allow") == "POST")
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        #expect(body.error == "method_not_allowed")
    }

    @Test("an 11 MiB body against a 10 MiB limit gets a JSON 413 and the gateway stays up")
    func bodyLimit() async throws {
        let gateway = try TestGateway(directConfig())
        defer { Task { await gateway.stop() } }
        let connection = try gateway.connect()
        try await connection.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: \(11 * 1024 * 1024)\r\n\r\n")
        try? await connection.send([UInt8](repeating: 0x61, count: 256 * 1024))
        let response = try #require(try await connection.readResponse())
        #expect(response.status == 413)
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        #expect(body.error == "payload_too_large")
        let ok = try await gateway.request("POST", "/upload", body: [UInt8](repeating: 0x62, count: 10 * 1024 * 1024))
        #expect(ok.status == 201)
    }

    @Test("malformed requests get a JSON 400", arguments: [
        "GET /a/../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /ping HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
        "GET /ping HTTP/1.1\r\n\r\n",
    ])
    func malformed(raw: String) async throws {
        let gateway = try TestGateway(directConfig())
        defer { Task { await gateway.stop() } }
        let connection = try gateway.connect()
        try await connection.send(raw)
        let response = try #require(try await connection.readResponse())
        #expect(response.status == 400)
    }
}
