import Portico
import Testing

/// `protocol:` and `http2:` on an upstream (issue #45): HTTP/2 is the nio transport's, `auto` needs TLS.
@Suite("HTTP/2 upstream configuration")
struct HTTP2ConfigTests {
    @Test("protocol and http2 are read; http1 is the default")
    func parsed() throws {
        let config = try load("""
            upstreams:
              a: { url: "http://a:8080", transport: nio, protocol: http2,
                   http2: { max_concurrent_streams: 50, connections_per_loop: 2, ping_interval: 10s, ping_timeout: 2s } }
              b: { url: "https://b", transport: nio, protocol: auto }
              c: { url: "http://c" }
            \(minimalRoute)
            """)
        let a = try #require(config.upstreams["a"])
        #expect(a.httpProtocol == .http2)
        #expect(a.http2.maxConcurrentStreams == 50)
        #expect(a.http2.connectionsPerLoop == 2)
        #expect(a.http2.pingInterval == .seconds(10))
        #expect(a.http2.pingTimeout == .seconds(2))
        #expect(config.upstreams["b"]?.httpProtocol == .auto)
        #expect(config.upstreams["b"]?.http2 == HTTP2Config())
        #expect(config.upstreams["c"]?.httpProtocol == .http1)
    }

    @Test("http2 and auto need nio, auto needs https, http2: needs a protocol that uses it, limits are checked")
    func refused() {
        #expect(diagnostics("""
            upstreams:
              a: { url: "http://a", protocol: http2 }
              b: { url: "http://b", transport: nio, protocol: auto }
              c: { url: "http://c", transport: nio, http2: { max_concurrent_streams: 10 } }
              d: { url: "http://d", transport: nio, protocol: http3 }
              e: { url: "http://e", transport: nio, protocol: http2, http2: { max_concurrent_streams: 0, pings: 1 } }
            \(minimalRoute)
            """) == [
            "portico.yaml:2 upstreams.a.protocol: http2 needs transport: nio (the urlsession transport speaks HTTP/1.1 to upstreams on Linux)",
            "portico.yaml:3 upstreams.b.protocol: auto chooses by TLS's ALPN and needs an https:// URL; use http2 for prior knowledge (h2c) over http://",
            "portico.yaml:4 upstreams.c.http2: applies to protocol: http2 or auto",
            #"portico.yaml:5 upstreams.d.protocol: expected one of http1, http2, auto, got "http3" (did you mean "http1"?)"#,
            "portico.yaml:6 upstreams.e.http2.max_concurrent_streams: must be between 1 and 10000, got 0",
            #"portico.yaml:6 upstreams.e.http2.pings: unknown key "pings""#,
        ])
    }
}
