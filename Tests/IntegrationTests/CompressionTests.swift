import Foundation
import Portico
import PorticoTesting
import Testing

/// `compress` in the real gateway, against a real loopback upstream, over both transports.
@Suite("Response compression through the gateway")
struct CompressionTests {
    /// The conformance suite's gateway (`/api/…` → upstream `/base/…`) with `compress` on the route.
    static func gateway(_ upstream: TestUpstream, _ transport: UpstreamConfig.Transport) throws -> TestGateway {
        try ProxyConformanceTests.gateway(upstream, transport) { config in
            config.middleware = ["gz": .compress(CompressConfig())]
            config.routes[0].middleware = ["gz"]
        }
    }

    /// JSON-like text of exactly `size` bytes.
    static func json(_ size: Int) -> [UInt8] {
        var text = "["
        var index = 0
        while text.utf8.count < size {
            text += #"{"id":\#(index),"name":"item-\#(index)","tags":["a","b"]},"#
            index += 1
        }
        return Array(text.utf8.prefix(size))
    }

    @Test("bodies from 0 bytes to several MiB arrive gzip and decompress to the upstream's bytes",
          arguments: UpstreamConfig.Transport.allCases)
    func roundTrips(transport: UpstreamConfig.Transport) async throws {
        let upstream = try await ProxyConformanceTests.started()
        let gateway = try Self.gateway(upstream, transport)
        for size in [0, 1, 1023, 1024, 65_536, 1_000_003, 5 * 1024 * 1024 + 3] {
            let body = Self.json(size)
            upstream.route("/base/items/\(size)", TestUpstream.Response(
                headers: [("Content-Type", "application/json"), ("ETag", #""e\#(size)""#)], body: body))
            let response = try await gateway.request("GET", "/api/items/\(size)", headers: [("Accept-Encoding", "gzip, br")])
            #expect(response.status == 200)
            if size <= Body.bufferedLimit {
                #expect(response.header("content-length") == String(response.body.count), "size \(size)")
            } else {
                // A larger body streams: compressed chunk by chunk, sent chunked.
                #expect(response.header("content-length") == nil, "size \(size)")
                #expect(response.header("transfer-encoding") == "chunked", "size \(size)")
            }
            if size < 1024 {
                #expect(response.header("content-encoding") == nil, "size \(size)")
                if let difference = ByteDifference(response.body, expected: body) { Issue.record("size \(size): \(difference)") }
                #expect(response.header("etag") == #""e\#(size)""#)
            } else {
                #expect(response.header("content-encoding") == "gzip", "size \(size)")
                #expect(response.body.count < body.count)
                #expect(try Zlib.decompress(response.body, limit: 8 << 20) == body, "size \(size)")
                #expect(response.header("vary") == "Accept-Encoding")
                #expect(response.header("etag") == #"W/"e\#(size)""#)
            }
        }
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("a client without gzip, and one refusing identity, both get the identity bytes",
          arguments: UpstreamConfig.Transport.allCases)
    func identityClients(transport: UpstreamConfig.Transport) async throws {
        let upstream = try await ProxyConformanceTests.started()
        let body = Self.json(20_000)
        upstream.route("/base/doc", TestUpstream.Response(headers: [("Content-Type", "text/html; charset=utf-8")], body: body))
        let gateway = try Self.gateway(upstream, transport)
        for headers in [[], [("Accept-Encoding", "identity;q=0")], [("Accept-Encoding", "")], [("Accept-Encoding", "gzip;q=0, br")]] {
            let response = try await gateway.request("GET", "/api/doc", headers: headers)
            #expect(response.status == 200, "\(headers)")
            #expect(response.header("content-encoding") == nil, "\(headers)")
            if let difference = ByteDifference(response.body, expected: body) { Issue.record("\(headers): \(difference)") }
            #expect(response.header("vary") == "Accept-Encoding")
        }
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("HEAD gets the identity length with the GET's Vary and weak ETag", arguments: UpstreamConfig.Transport.allCases)
    func head(transport: UpstreamConfig.Transport) async throws {
        let upstream = try await ProxyConformanceTests.started()
        let body = Self.json(50_000)
        upstream.route("/base/doc", TestUpstream.Response(headers: [("Content-Type", "application/json"), ("ETag", #""v""#)], body: body))
        let gateway = try Self.gateway(upstream, transport)
        let head = try await gateway.request("HEAD", "/api/doc", headers: [("Accept-Encoding", "gzip")])
        let get = try await gateway.request("GET", "/api/doc", headers: [("Accept-Encoding", "gzip")])
        #expect(head.status == 200)
        #expect(head.body.isEmpty)
        #expect(head.header("content-length") == "50000")
        #expect(head.header("content-encoding") == nil)
        #expect(head.header("vary") == get.header("vary"))
        #expect(head.header("etag") == get.header("etag"))
        #expect(get.header("content-encoding") == "gzip")
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("an upstream's own gzip and a no-transform response pass through untouched",
          arguments: UpstreamConfig.Transport.allCases)
    func untouched(transport: UpstreamConfig.Transport) async throws {
        let upstream = try await ProxyConformanceTests.started()
        let plain = Self.json(30_000)
        upstream.route("/base/gz", TestUpstream.Response.gzip(plain, headers: [("Content-Type", "application/json")]))
        upstream.route("/base/nt", TestUpstream.Response(headers: [("Content-Type", "application/json"),
                                                              ("Cache-Control", "no-transform")], body: plain))
        let gateway = try Self.gateway(upstream, transport)
        let gz = try await gateway.request("GET", "/api/gz", headers: [("Accept-Encoding", "gzip")])
        #expect(gz.headers("content-encoding") == ["gzip"])
        #expect(try Zlib.decompress(gz.body, limit: 1 << 20) == plain)
        let nt = try await gateway.request("GET", "/api/nt", headers: [("Accept-Encoding", "gzip")])
        #expect(nt.header("content-encoding") == nil)
        #expect(nt.header("vary") == nil)
        if let difference = ByteDifference(nt.body, expected: plain) { Issue.record("\(difference)") }
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("the YAML config wires compress into a route")
    func fromYAML() async throws {
        let upstream = try await ProxyConformanceTests.started()
        let body = Self.json(4_000)
        upstream.route("/x", TestUpstream.Response(headers: [("Content-Type", "application/vnd.api+json")], body: body))
        let config = try ConfigLoader.load(yaml: """
            upstreams:
              up: { url: "http://127.0.0.1:\(upstream.port)", transport: nio }
            middleware:
              gz: { type: compress, level: 1, min_bytes: 2KiB }
            routes:
              - { name: api, match: { path_prefix: / }, upstream: up, middleware: [gz] }
            """, source: "test.yaml", environment: [:])
        let gateway = try TestGateway(config)
        let response = try await gateway.request("GET", "/x", headers: [("Accept-Encoding", "GZIP;q=0.5")])
        #expect(response.header("content-encoding") == "gzip")
        #expect(try Zlib.decompress(response.body) == body)
        await gateway.stop()
        await upstream.shutdown()
    }
}
