import Foundation
import Portico
import PorticoTesting
import Testing

/// Portico against servers it did not write: Python's http.server and nginx.
@Suite("Independent upstreams", .enabled(if: ExternalServer.available("nginx") && ExternalServer.available("python3"),
                                         "needs nginx and python3 (scripts/test installs them)"))
struct IndependentUpstreamTests {
    static func gateway(port: Int, _ transport: UpstreamConfig.Transport) throws -> TestGateway {
        var config = PorticoConfig()
        var upstream = UpstreamConfig(name: "independent", url: URL(string: "http://127.0.0.1:\(port)")!)
        upstream.transport = transport
        config.upstreams = ["independent": upstream]
        config.routes = [RouteConfig(name: "all", match: .init(pathPrefix: "/"), upstream: "independent")]
        return try TestGateway(config)
    }

    @Test("files from Python's http.server arrive byte for byte, HEAD included", arguments: UpstreamConfig.Transport.allCases)
    func pythonFiles(transport: UpstreamConfig.Transport) async throws {
        let blob = RandomBytes.make(300_000)
        let server = try await ExternalServer.pythonFileServer(files: ["blob.bin": blob, "hello.txt": Array("hello\n".utf8)])
        defer { server.stop() }
        let gateway = try Self.gateway(port: server.port, transport)
        let response = try await gateway.request("GET", "/blob.bin")
        #expect(response.status == 200)
        if let difference = ByteDifference(response.body, expected: blob) { Issue.record("\(difference)") }
        let head = try await gateway.request("HEAD", "/blob.bin")
        #expect(head.status == 200)
        #expect(head.header("content-length") == String(blob.count))
        #expect(head.body.isEmpty)
        let missing = try await gateway.request("GET", "/nope.txt")
        #expect(missing.status == 404)
        // Python answers a directory without its slash with a 301: passed through, not followed.
        let redirect = try await gateway.request("GET", "/sub")
        #expect([301, 404].contains(redirect.status))
        await gateway.stop()
    }

    @Test("nginx sees the raw target, the forwarding headers and the body; its gzip passes through consistently",
          arguments: UpstreamConfig.Transport.allCases)
    func nginx(transport: UpstreamConfig.Transport) async throws {
        let server = try await ExternalServer.nginx(serverBlock: """
            gzip on; gzip_min_length 1; gzip_types text/plain application/json;
            location /echo {
              default_type text/plain;
              return 200 "method=$request_method uri=$request_uri xff=$http_x_forwarded_for host=$http_host via=$http_via ua=$http_user_agent\\n";
            }
            location /big { default_type application/json; return 200 '\(String(repeating: "{\\\"k\\\":\\\"value\\\"},", count: 100))'; }
            location /moved { return 307 /elsewhere; }
            location /teapot { return 418; }
            """)
        defer { server.stop() }
        let gateway = try Self.gateway(port: server.port, transport)
        let echo = try await gateway.request("GET", "/echo/a%2Fb?q=1+2&q=%2F", headers: [("User-Agent", "itest/1")])
        #expect(echo.status == 200)
        #expect(echo.bodyText.contains("method=GET uri=/echo/a%2Fb?q=1+2&q=%2F "))
        #expect(echo.bodyText.contains("xff=127.0.0.1"))
        #expect(echo.bodyText.contains("host=127.0.0.1:\(server.port)"))
        #expect(echo.bodyText.contains("via=1.1 portico"))
        #expect(echo.bodyText.contains("ua=itest/1"))

        let gzipped = try await gateway.request("GET", "/big", headers: [("Accept-Encoding", "gzip")])
        #expect(gzipped.status == 200)
        if gzipped.header("content-encoding") == "gzip" {
            let plain = try Zlib.decompress(gzipped.body, limit: 1 << 20)
            #expect(String(decoding: plain, as: UTF8.self).hasPrefix("{\"k\":\"value\"},"))
        } else {
            #expect(gzipped.bodyText.hasPrefix("{\"k\":\"value\"},"))
        }
        let identity = try await gateway.request("GET", "/big")
        #expect(identity.header("content-encoding") == nil)
        #expect(identity.bodyText.hasPrefix("{\"k\":\"value\"},"))

        let moved = try await gateway.request("GET", "/moved")
        #expect(moved.status == 307)
        #expect(moved.header("location")?.hasSuffix("/elsewhere") == true)
        #expect(try await gateway.request("GET", "/teapot").status == 418)
        await gateway.stop()
    }
}
