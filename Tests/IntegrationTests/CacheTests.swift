import Foundation
import HTTPTypes
import Logging
import Portico
import PorticoTesting
import Testing

/// `/api/` proxied to `port` through `[log, cache]` (plus `auth` with a static credential when asked).
func cacheConfig(upstreamPort: Int, _ cache: CacheConfig, withAuth: Bool = false) -> PorticoConfig {
    var config = PorticoConfig()
    config.upstreams["app"] = UpstreamConfig(name: "app", url: URL(string: "http://127.0.0.1:\(upstreamPort)")!)
    config.upstreams["app"]?.transport = .nio
    config.middleware["log"] = .accessLog(AccessLogConfig())
    config.middleware["cache"] = .cache(cache)
    var chain = ["log", "cache"]
    if withAuth {
        config.credentials["app"] = CredentialConfig(kind: .staticHeader(header: "Authorization", value: "Bearer injected-secret"))
        config.middleware["auth"] = .auth(AuthConfig(credential: "app"))
        chain.append("auth")
    }
    config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api/"), upstream: "app", middleware: chain)]
    return config
}

/// `withGateway` for the cache's configuration, on `clock`.
func withCachingGateway(_ upstream: TestUpstream, clock: ManualClock, logger: Logger? = nil,
                        _ configure: (inout CacheConfig) -> Void = { _ in }, withAuth: Bool = false,
                        _ body: (TestGateway) async throws -> Void) async throws {
    var cache = CacheConfig()
    configure(&cache)
    try await withGateway(upstream, { cacheConfig(upstreamPort: $0, cache, withAuth: withAuth) }, logger: logger, clock: clock, body)
}

extension TestGateway {
    var cache: CacheMiddleware? { server.gateway.current.caches.first }
}

@Suite("Cache through the real gateway")
struct CacheTests {
    @Test("N concurrent misses make one upstream request and all get its response")
    func coalescedMisses() async throws {
        let upstream = TestUpstream()
        let gate = AsyncGate()
        upstream.route("/api/report") { _ in
            await gate.wait()
            return TestUpstream.Response(status: 200, headers: [("Cache-Control", "max-age=60"), ("Content-Type", "text/plain")],
                                         body: "expensive report")
        }
        let log = AccessLogCapture()
        try await withCachingGateway(upstream, clock: ManualClock(), logger: log.logger) { gateway in
            let count = 8
            let bodies = try await withThrowingTaskGroup(of: String.self) { group in
                for _ in 0..<count {
                    group.addTask { try await gateway.request("GET", "/api/report").bodyText }
                }
                try await Eventually.wait(timeout: .seconds(60), "one upstream request and \(count - 1) waiters") {
                    upstream.hits("/api/report") == 1 && (gateway.cache?.waitingRequests ?? 0) == count - 1
                }
                gate.open()
                var bodies: [String] = []
                for try await body in group { bodies.append(body) }
                return bodies
            }
            #expect(bodies == Array(repeating: "expensive report", count: count))
            #expect(upstream.hits("/api/report") == 1)
            let statuses = log.records.compactMap { $0["cache"]?.description }
            #expect(statuses.filter { $0 == "collapsed" }.count == count - 1)
            #expect(statuses.filter { $0 == "miss" }.count == 1)
        }
    }

    @Test("a stale entry is revalidated with If-None-Match and the 304 answers from the cache")
    func revalidation() async throws {
        let upstream = TestUpstream()
        upstream.route("/api/doc") { request in
            if request.values("If-None-Match") == ["\"v1\""] {
                return TestUpstream.Response(status: 304, headers: [("ETag", "\"v1\""), ("Cache-Control", "max-age=10")])
            }
            return TestUpstream.Response(status: 200, headers: [("ETag", "\"v1\""), ("Cache-Control", "max-age=10")], body: "document")
        }
        let clock = ManualClock()
        try await withCachingGateway(upstream, clock: clock) { gateway in
            let first = try await gateway.request("GET", "/api/doc")
            #expect(first.bodyText == "document" && first.header("Cache-Status")?.contains("stored") == true)
            let hit = try await gateway.request("GET", "/api/doc")
            #expect(hit.header("Cache-Status") == "portico; hit; ttl=10" && hit.header("Age") == "0")
            clock.advance(by: .seconds(20))
            let revalidated = try await gateway.request("GET", "/api/doc")
            #expect(revalidated.status == 200 && revalidated.bodyText == "document")
            #expect(revalidated.header("Cache-Status") == "portico; fwd=stale; fwd-status=304; ttl=10; stored")
            #expect(upstream.hits("/api/doc") == 2)
            let conditional = try await gateway.request("GET", "/api/doc", headers: [("If-None-Match", "\"v1\"")])
            #expect(conditional.status == 304 && conditional.body.isEmpty)
            let head = try await gateway.request("HEAD", "/api/doc")
            #expect(head.status == 200 && head.header("Content-Length") == "8" && head.body.isEmpty)
            #expect(upstream.hits("/api/doc") == 2)
        }
    }

    @Test("stale-while-revalidate: the stale entry answers at once and a background request refreshes it")
    func staleWhileRevalidate() async throws {
        let upstream = TestUpstream()
        let version = CallCounter()
        upstream.route("/api/feed") { _ in
            TestUpstream.Response(status: 200, headers: [("Cache-Control", "max-age=1, stale-while-revalidate=60")],
                                  body: "v\(version.next())")
        }
        let clock = ManualClock()
        try await withCachingGateway(upstream, clock: clock) { gateway in
            #expect(try await gateway.request("GET", "/api/feed").bodyText == "v1")
            clock.advance(by: .seconds(5))
            let stale = try await gateway.request("GET", "/api/feed")
            #expect(stale.bodyText == "v1")
            #expect(stale.header("Cache-Status") == "portico; hit; ttl=-4; detail=stale-while-revalidate")
            try await Eventually.wait(timeout: .seconds(60), "the background refresh") {
                upstream.hits("/api/feed") == 2 && gateway.cache?.backgroundRefreshes == 0
            }
            let refreshed = try await gateway.request("GET", "/api/feed")
            #expect(refreshed.bodyText == "v2" && refreshed.header("Cache-Status") == "portico; hit; ttl=1")
        }
    }

    @Test("stale-if-error: with the upstream down, the stale entry is served")
    func staleIfErrorUpstreamDown() async throws {
        let upstream = TestUpstream()
        upstream.route("/api/status", TestUpstream.Response(status: 200, headers: [("Cache-Control", "max-age=5, stale-if-error=600")],
                                                            body: "all good"))
        let clock = ManualClock()
        try await withCachingGateway(upstream, clock: clock) { gateway in
            _ = try await gateway.request("GET", "/api/status")
            await upstream.shutdown()
            clock.advance(by: .seconds(30))
            let response = try await gateway.request("GET", "/api/status")
            #expect(response.status == 200 && response.bodyText == "all good")
            #expect(response.header("Cache-Status") == "portico; fwd=stale; ttl=-25; detail=stale-if-error")
            #expect(response.header("Age") == "30")
            // Another path has nothing stored: the failure reaches the client, marked by the cache.
            let failure = try await gateway.request("GET", "/api/other")
            #expect(failure.status == 502 && failure.header("Cache-Status") == "portico; fwd=uri-miss")
        }
    }

    @Test("Vary: Accept-Encoding keeps one variant per encoding")
    func varyOnAcceptEncoding() async throws {
        let upstream = TestUpstream()
        let plain = Array("hello, hello, hello, hello".utf8)
        upstream.route("/api/text") { request in
            let headers: [(name: String, value: String)] = [("Cache-Control", "max-age=60"), ("Vary", "Accept-Encoding")]
            if request.values("Accept-Encoding").joined().contains("gzip") { return .gzip(plain, headers: headers) }
            return TestUpstream.Response(status: 200, headers: headers, body: plain)
        }
        try await withCachingGateway(upstream, clock: ManualClock()) { gateway in
            let gzip = try await gateway.request("GET", "/api/text", headers: [("Accept-Encoding", "gzip")])
            let identity = try await gateway.request("GET", "/api/text")
            let gzipAgain = try await gateway.request("GET", "/api/text", headers: [("Accept-Encoding", "GZIP")])
            let identityAgain = try await gateway.request("GET", "/api/text")
            #expect(gzip.header("Content-Encoding") == "gzip" && gzipAgain.header("Content-Encoding") == "gzip")
            #expect(try Zlib.decompress(gzipAgain.body) == plain)
            #expect(identity.header("Content-Encoding") == nil)
            if let difference = ByteDifference(identityAgain.body, expected: plain) { Issue.record("\(difference)") }
            #expect(identity.header("Cache-Status") == "portico; fwd=vary-miss; fwd-status=200; ttl=60; stored")
            #expect(gzipAgain.header("Cache-Status") == "portico; hit; ttl=60")
            #expect(identityAgain.header("Cache-Status") == "portico; hit; ttl=60")
            #expect(upstream.hits("/api/text") == 2)
        }
    }

    @Test("max_bytes: the least recently used responses are evicted")
    func eviction() async throws {
        let upstream = TestUpstream()
        upstream.route("/api/blob") { request in
            TestUpstream.Response(status: 200, headers: [("Cache-Control", "max-age=600")],
                                  body: String(repeating: "b", count: 1500) + (request.query ?? ""))
        }
        // Each entry holds about 2 KiB (body, fields, key): five do not fit in 8 KiB.
        try await withCachingGateway(upstream, clock: ManualClock(), { $0.maxBytes = 8 << 10 }) { gateway in
            for i in 1...5 { _ = try await gateway.request("GET", "/api/blob?\(i)") }
            #expect(upstream.hits("/api/blob") == 5)
            let latest = try await gateway.request("GET", "/api/blob?5")
            #expect(latest.header("Cache-Status") == "portico; hit; ttl=600")
            let evicted = try await gateway.request("GET", "/api/blob?1")
            #expect(evicted.header("Cache-Status")?.hasPrefix("portico; fwd=uri-miss") == true)
            #expect(upstream.hits("/api/blob") == 6)
            let store = try #require(gateway.cache?.store)
            #expect(store.storedBytes <= 8 << 10)
        }
    }

    @Test("the injected credential is not part of the key: clients share the entry, the upstream sees the credential")
    func credentialOutsideKey() async throws {
        let upstream = TestUpstream()
        upstream.route("/api/me") { request in
            TestUpstream.Response(status: 200, headers: [("Cache-Control", "max-age=60")],
                                  body: request.values("Authorization").first == "Bearer injected-secret" ? "authorised" : "anonymous")
        }
        let log = AccessLogCapture()
        try await withCachingGateway(upstream, clock: ManualClock(), logger: log.logger, withAuth: true) { gateway in
            let first = try await gateway.request("GET", "/api/me", headers: [("X-Client", "a")])
            let second = try await gateway.request("GET", "/api/me", headers: [("X-Client", "b")])
            #expect(first.bodyText == "authorised" && second.bodyText == "authorised")
            #expect(upstream.hits("/api/me") == 1)
            #expect(log.records.compactMap { $0["cache"]?.description } == ["miss", "hit"])
        }
    }

    @Test("POST invalidates the stored GET for the same URI")
    func invalidation() async throws {
        let upstream = TestUpstream()
        let version = CallCounter()
        upstream.route("/api/item") { request in
            if request.method == "POST" { return TestUpstream.Response(status: 204) }
            return TestUpstream.Response(status: 200, headers: [("Cache-Control", "max-age=600")], body: "v\(version.next())")
        }
        try await withCachingGateway(upstream, clock: ManualClock()) { gateway in
            #expect(try await gateway.request("GET", "/api/item").bodyText == "v1")
            #expect(try await gateway.request("GET", "/api/item").bodyText == "v1")
            let post = try await gateway.request("POST", "/api/item", body: Array("x".utf8))
            #expect(post.status == 204 && post.header("Cache-Status") == "portico; fwd=method; fwd-status=204")
            #expect(try await gateway.request("GET", "/api/item").bodyText == "v2")
        }
    }

    @Test("targeted_cache_control: CDN-Cache-Control governs the cache, Cache-Control still reaches the client")
    func targetedCacheControl() async throws {
        let upstream = TestUpstream()
        let version = CallCounter()
        upstream.route("/api/feed") { _ in
            TestUpstream.Response(status: 200, headers: [("Cache-Control", "no-store"), ("CDN-Cache-Control", "max-age=60")],
                                  body: "v\(version.next())")
        }
        let clock = ManualClock()
        try await withCachingGateway(upstream, clock: clock, { $0.targetedCacheControl = [HTTPField.Name("CDN-Cache-Control")!] }) { gateway in
            #expect(try await gateway.request("GET", "/api/feed").bodyText == "v1")
            let hit = try await gateway.request("GET", "/api/feed")
            #expect(hit.bodyText == "v1")
            #expect(hit.header("Cache-Status") == "portico; hit; ttl=60")
            #expect(hit.header("Cache-Control") == "no-store" && hit.header("CDN-Cache-Control") == "max-age=60")
            clock.advance(by: .seconds(61))
            #expect(try await gateway.request("GET", "/api/feed").bodyText == "v2")
            #expect(upstream.hits("/api/feed") == 2)
        }
        // Without the setting the same upstream is not cached at all.
        try await withCachingGateway(upstream, clock: ManualClock()) { gateway in
            let first = try await gateway.request("GET", "/api/feed")
            let second = try await gateway.request("GET", "/api/feed")
            #expect(first.bodyText == "v3" && second.bodyText == "v4")
            #expect(second.header("Cache-Status") == "portico; fwd=uri-miss; fwd-status=200")
        }
    }
}
