import HTTPTypes
import Portico
import PorticoTesting
import Testing

@Suite("Cache middleware with a manual clock")
struct CacheMiddlewareTests {
    let clock = ManualClock()

    func cache(_ configure: (inout CacheConfig) -> Void = { _ in }) -> CacheMiddleware {
        CacheMiddleware(name: "test", CacheFixture.config(configure))
    }

    func send(_ cache: CacheMiddleware, _ upstream: ScriptedUpstream, _ method: HTTPRequest.Method = .get,
              _ target: String = "/items/1", headers: [(String, String)] = []) async throws -> (GatewayResponse, String?) {
        let context = CacheFixture.context(clock)
        let response = try await cache.handle(CacheFixture.request(method, target, headers: headers), context: context,
                                              next: upstream.next)
        return (response, context.stats.snapshot.cacheStatus)
    }

    @Test("a miss is stored, the next request is a hit with Age, and the upstream is asked once")
    func missThenHit() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")]))
        let (first, firstLog) = try await send(cache, upstream)
        #expect(first.cacheStatus == "portico; fwd=uri-miss; fwd-status=200; ttl=60; stored")
        #expect(firstLog == "miss")
        clock.advance(by: .seconds(15))
        let (second, secondLog) = try await send(cache, upstream)
        #expect(second.cacheStatus == "portico; hit; ttl=45")
        #expect(second.headerFields[.age] == "15")
        #expect(second.text == "payload")
        #expect(secondLog == "hit")
        #expect(upstream.calls == 1)
    }

    @Test("a stale entry is validated with its ETag; the 304 refreshes it")
    func revalidation() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? CacheFixture.response(headers: [("Cache-Control", "max-age=10"), ("ETag", "\"v1\""), ("X-Gen", "1")])
                : CacheFixture.response(304, headers: [("Cache-Control", "max-age=100"), ("ETag", "\"v1\""), ("X-Gen", "2")], body: "")
        }
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(11))
        let (validated, log) = try await send(cache, upstream)
        #expect(upstream.requests.last?.headerFields[.ifNoneMatch] == "\"v1\"")
        #expect(validated.status == .ok && validated.text == "payload")
        #expect(validated.headerFields[HTTPField.Name("X-Gen")!] == "2")
        #expect(validated.cacheStatus == "portico; fwd=stale; fwd-status=304; ttl=100; stored")
        #expect(log == "revalidated")
        let (hit, _) = try await send(cache, upstream)
        #expect(hit.cacheStatus == "portico; hit; ttl=100")
        #expect(upstream.calls == 2)
    }

    @Test("a changed resource replaces the stored one")
    func modified() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream { n, _ in
            CacheFixture.response(headers: [("Cache-Control", "max-age=10"), ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT")],
                                  body: "v\(n)")
        }
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(20))
        let (second, _) = try await send(cache, upstream)
        #expect(upstream.requests.last?.headerFields[.ifModifiedSince] == "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(second.text == "v2")
        let (third, _) = try await send(cache, upstream)
        #expect(third.text == "v2" && upstream.calls == 2)
    }

    @Test("a client's own conditional request is answered 304 from a fresh entry, and from a miss")
    func clientConditional() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60"), ("ETag", "\"v1\"")]))
        let (miss, _) = try await send(cache, upstream, headers: [("If-None-Match", "\"v1\"")])
        #expect(miss.status == .notModified && miss.body.count == 0)
        #expect(upstream.requests.first?.headerFields[.ifNoneMatch] == nil)  // fetched in full, to store it
        let (hit, _) = try await send(cache, upstream, headers: [("If-None-Match", "W/\"v1\"")])
        #expect(hit.status == .notModified && hit.headerFields[.eTag] == "\"v1\"" && hit.cacheStatus == "portico; hit; ttl=60")
        let (other, _) = try await send(cache, upstream, headers: [("If-None-Match", "\"v0\"")])
        #expect(other.status == .ok && other.text == "payload")
        #expect(upstream.calls == 1)
    }

    @Test("HEAD is answered from a stored GET with its length; a HEAD miss passes through unstored")
    func head() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")]))
        let (headMiss, _) = try await send(cache, upstream, .head)
        #expect(headMiss.cacheStatus == "portico; fwd=uri-miss; fwd-status=200")
        _ = try await send(cache, upstream)
        let (head, log) = try await send(cache, upstream, .head)
        #expect(head.body.count == 0 && head.headerFields[.contentLength] == "7" && log == "hit")
        #expect(upstream.calls == 2)
    }

    @Test("only-if-cached: 504 when nothing usable is stored, never asking the upstream")
    func onlyIfCached() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")]))
        let error = await #expect(throws: GatewayError.self) {
            try await send(cache, upstream, headers: [("Cache-Control", "only-if-cached")])
        }
        #expect(error?.status == .gatewayTimeout)
        #expect(error?.headerFields[HTTPField.Name("Cache-Status")!] == "portico; detail=only-if-cached")
        #expect(upstream.calls == 0)
        _ = try await send(cache, upstream)
        let (hit, _) = try await send(cache, upstream, headers: [("Cache-Control", "only-if-cached")])
        #expect(hit.status == .ok && upstream.calls == 1)
    }

    @Test("request no-cache and Pragma: no-cache go to the upstream even when fresh")
    func requestNoCache() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")]))
        _ = try await send(cache, upstream)
        let (reload, _) = try await send(cache, upstream, headers: [("Cache-Control", "no-cache")])
        #expect(reload.cacheStatus == "portico; fwd=request; fwd-status=200; ttl=60; stored")
        _ = try await send(cache, upstream, headers: [("Pragma", "no-cache")])
        #expect(upstream.calls == 3)
    }

    @Test("stale-if-error serves the stale entry when the upstream fails or answers 5xx")
    func staleIfError() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream { n, _ in
            switch n {
            case 1: return CacheFixture.response(headers: [("Cache-Control", "max-age=10, stale-if-error=60")])
            case 2: throw UpstreamError.connectFailed("connection refused").gatewayError(upstream: "items")
            default: return CacheFixture.response(503, body: "down")
            }
        }
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(20))
        let (down, log) = try await send(cache, upstream)
        #expect(down.status == .ok && down.text == "payload" && log == "stale")
        #expect(down.cacheStatus == "portico; fwd=stale; ttl=-10; detail=stale-if-error")
        let (unavailable, _) = try await send(cache, upstream)
        #expect(unavailable.status == .ok && unavailable.cacheStatus == "portico; fwd=stale; fwd-status=503; ttl=-10; detail=stale-if-error")
        clock.advance(by: .seconds(60))  // past the window
        let (late, _) = try await send(cache, upstream)
        #expect(late.status == .serviceUnavailable)
    }

    @Test("without stale-if-error (or with must-revalidate) the upstream's failure reaches the client, marked")
    func noStaleOnError() async throws {
        let cache = cache { $0.staleIfError = .seconds(300) }
        let upstream = ScriptedUpstream { n, _ in
            if n == 1 { return CacheFixture.response(headers: [("Cache-Control", "max-age=10, must-revalidate")]) }
            throw UpstreamError.connectFailed("connection refused").gatewayError(upstream: "items")
        }
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(20))
        let error = await #expect(throws: GatewayError.self) { try await send(cache, upstream) }
        #expect(error?.code == "upstream_unavailable")
        #expect(error?.headerFields[HTTPField.Name("Cache-Status")!] == "portico; fwd=stale")
    }

    @Test("stale-while-revalidate answers at once and refreshes once in the background")
    func staleWhileRevalidate() async throws {
        let cache = cache()
        let gate = AsyncGate()
        let upstream = ScriptedUpstream { n, _ in
            if n > 1 { await gate.wait() }
            return CacheFixture.response(headers: [("Cache-Control", "max-age=10, stale-while-revalidate=30")], body: "v\(n)")
        }
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(15))
        let (stale, log) = try await send(cache, upstream)
        #expect(stale.text == "v1" && log == "stale")
        #expect(stale.cacheStatus == "portico; hit; ttl=-5; detail=stale-while-revalidate")
        let (again, _) = try await send(cache, upstream)
        #expect(again.text == "v1")
        try await Eventually.wait { upstream.calls == 2 }
        #expect(cache.backgroundRefreshes == 1)
        gate.open()
        try await Eventually.wait { cache.backgroundRefreshes == 0 }
        let (fresh, freshLog) = try await send(cache, upstream)
        #expect(fresh.text == "v2" && freshLog == "hit")
        #expect(upstream.calls == 2)
    }

    @Test("a HEAD in the stale-while-revalidate window refreshes the entry with a GET")
    func headTriggersGetRefresh() async throws {
        let cache = cache { $0.staleWhileRevalidate = .seconds(30) }
        let upstream = ScriptedUpstream { n, request in
            CacheFixture.response(headers: [("Cache-Control", "max-age=10")], body: request.method == .head ? "" : "body \(n)")
        }
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(15))
        let (head, log) = try await send(cache, upstream, .head)
        #expect(head.body.count == 0 && head.headerFields[.contentLength] == "6" && log == "stale")
        try await Eventually.wait { upstream.calls == 2 && cache.backgroundRefreshes == 0 }
        #expect(upstream.requests.last?.method == .get)
        let (get, getLog) = try await send(cache, upstream)
        #expect(get.text == "body 2" && getLog == "hit")
    }

    @Test("shutdown cancels a background refresh stuck on the upstream")
    func shutdownCancelsRefresh() async throws {
        let cache = cache { $0.staleWhileRevalidate = .seconds(30) }
        let upstream = ScriptedUpstream { [clock] n, _ in
            if n > 1 { try await clock.sleep(for: .seconds(3600)) }
            return CacheFixture.response(headers: [("Cache-Control", "max-age=10")])
        }
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(15))
        _ = try await send(cache, upstream)
        try await Eventually.wait { upstream.calls == 2 }
        await cache.shutdown()
        #expect(cache.backgroundRefreshes == 0)
    }

    @Test("concurrent misses for one key make one upstream request; all get its response")
    func coalescing() async throws {
        let cache = cache()
        let gate = AsyncGate()
        let upstream = ScriptedUpstream { _, _ in
            await gate.wait()
            return CacheFixture.response(headers: [("Cache-Control", "max-age=60")], body: "shared")
        }
        let statuses = try await withThrowingTaskGroup(of: (String, String?).self) { group in
            for _ in 0..<5 {
                group.addTask {
                    let (response, log) = try await send(cache, upstream)
                    return (response.text, log)
                }
            }
            try await Eventually.wait { upstream.calls == 1 }
            // Let the four followers queue up before the leader's answer arrives.
            try await Eventually.wait { cache.waitingRequests >= 4 }
            gate.open()
            var results: [(String, String?)] = []
            for try await result in group { results.append(result) }
            return results
        }
        #expect(upstream.calls == 1)
        #expect(statuses.allSatisfy { $0.0 == "shared" })
        #expect(statuses.filter { $0.1 == "collapsed" }.count == 4)
    }

    @Test("when the shared response may not be stored, waiters go to the upstream themselves")
    func coalescingUncacheable() async throws {
        let cache = cache()
        let gate = AsyncGate()
        let upstream = ScriptedUpstream { n, _ in
            if n == 1 { await gate.wait() }
            return CacheFixture.response(headers: [("Cache-Control", "no-store")], body: "private \(n)")
        }
        async let first = send(cache, upstream)
        try await Eventually.wait { upstream.calls == 1 }
        async let second = send(cache, upstream)
        try await Eventually.wait { cache.waitingRequests >= 1 }
        gate.open()
        let (a, b) = try await (first, second)
        #expect(a.0.text == "private 1" && b.0.text == "private 2")
        #expect(upstream.calls == 2)
    }

    @Test("after an uncacheable answer, concurrent requests for the URI do not queue behind each other")
    func hitForPass() async throws {
        let cache = cache()
        let gate = AsyncGate()
        let upstream = ScriptedUpstream { n, _ in
            if n > 1 { await gate.wait() }
            return CacheFixture.response(headers: [("Cache-Control", "no-store")], body: "live \(n)")
        }
        _ = try await send(cache, upstream)
        async let second = send(cache, upstream)
        async let third = send(cache, upstream)
        try await Eventually.wait { upstream.calls == 3 }  // both reached the held upstream
        #expect(cache.waitingRequests == 0)
        gate.open()
        let (b, c) = try await (second, third)
        #expect(Set([b.0.text, c.0.text]) == ["live 2", "live 3"])
    }

    @Test("Vary: each Accept-Encoding gets its own variant")
    func vary() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream { _, request in
            CacheFixture.response(headers: [("Cache-Control", "max-age=60"), ("Vary", "Accept-Encoding")],
                                  body: request.headerFields[.acceptEncoding] ?? "identity")
        }
        _ = try await send(cache, upstream, headers: [("Accept-Encoding", "gzip")])
        let (br, _) = try await send(cache, upstream, headers: [("Accept-Encoding", "br")])
        #expect(br.text == "br" && br.cacheStatus == "portico; fwd=vary-miss; fwd-status=200; ttl=60; stored")
        let (gzip, _) = try await send(cache, upstream, headers: [("Accept-Encoding", "GZIP")])
        #expect(gzip.text == "gzip" && gzip.cacheStatus == "portico; hit; ttl=60")
        let (none, _) = try await send(cache, upstream)
        #expect(none.text == "identity")
        #expect(upstream.calls == 3)
    }

    @Test("Authorization: not served an entry the response did not mark shareable; public ones are")
    func authorization() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream { _, request in
            request.target == "/public"
                ? CacheFixture.response(headers: [("Cache-Control", "public, max-age=60")])
                : CacheFixture.response(headers: [("Cache-Control", "max-age=60")])
        }
        let auth = [("Authorization", "Bearer client")]
        _ = try await send(cache, upstream)
        _ = try await send(cache, upstream, headers: auth)
        _ = try await send(cache, upstream, headers: auth)
        #expect(upstream.calls == 3)
        _ = try await send(cache, upstream, .get, "/public", headers: auth)
        let (hit, _) = try await send(cache, upstream, .get, "/public", headers: auth)
        #expect(hit.cacheStatus == "portico; hit; ttl=60" && upstream.calls == 4)
    }

    @Test("a successful unsafe request invalidates its URI and same-origin Location")
    func invalidation() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream { _, request in
            if request.method == .post {
                return CacheFixture.response(201, headers: [("Location", "http://api.test/items/2")])
            }
            return CacheFixture.response(headers: [("Cache-Control", "max-age=60")])
        }
        _ = try await send(cache, upstream, .get, "/items")
        _ = try await send(cache, upstream, .get, "/items/2")
        _ = try await send(cache, upstream, .get, "/items/3")
        let (post, log) = try await send(cache, upstream, .post, "/items")
        #expect(post.cacheStatus == "portico; fwd=method; fwd-status=201" && log == "bypass")
        _ = try await send(cache, upstream, .get, "/items")
        _ = try await send(cache, upstream, .get, "/items/2")
        _ = try await send(cache, upstream, .get, "/items/3")
        #expect(upstream.calls == 6)  // 3 misses, the POST, 2 misses after invalidation; /items/3 still a hit
    }

    @Test("Location targets: relative, absolute on this host, and other hosts")
    func sameOrigin() {
        #expect(CacheMiddleware.sameOriginTarget("/a?b=1", authority: "api.test", base: "/x/y") == "/a?b=1")
        #expect(CacheMiddleware.sameOriginTarget("z", authority: "api.test", base: "/x/y") == "/x/z")
        #expect(CacheMiddleware.sameOriginTarget("http://API.test/q", authority: "api.test", base: "/") == "/q")
        #expect(CacheMiddleware.sameOriginTarget("http://other.test/q", authority: "api.test", base: "/") == nil)
        #expect(CacheMiddleware.sameOriginTarget("http://api.test:81/q", authority: "api.test", base: "/") == nil)
    }

    @Test("private=\"…\" fields are not stored; no-cache=\"…\" fields only follow a validation")
    func qualifiedDirectives() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [
            ("Cache-Control", #"max-age=60, private="X-User", no-cache="X-Token""#), ("X-User", "ann"), ("X-Token", "t"),
        ]))
        let (miss, _) = try await send(cache, upstream)
        #expect(miss.headerFields[HTTPField.Name("X-User")!] == "ann" && miss.headerFields[HTTPField.Name("X-Token")!] == "t")
        let (hit, _) = try await send(cache, upstream)
        #expect(hit.headerFields[HTTPField.Name("X-User")!] == nil && hit.headerFields[HTTPField.Name("X-Token")!] == nil)
        #expect(upstream.calls == 1)
    }

    @Test("bodies over max_object_bytes pass through uncached; Range bypasses; X-Cache on request")
    func limitsAndBypass() async throws {
        let cache = cache {
            $0.maxObjectBytes = 4
            $0.xCache = true
        }
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")], body: "too long"))
        let (first, _) = try await send(cache, upstream)
        #expect(first.cacheStatus == "portico; fwd=uri-miss; fwd-status=200" && first.headerFields[HTTPField.Name("X-Cache")!] == "MISS")
        _ = try await send(cache, upstream)
        let (range, log) = try await send(cache, upstream, headers: [("Range", "bytes=0-1")])
        #expect(range.cacheStatus == "portico; fwd=bypass; fwd-status=200; detail=range" && log == "bypass")
        #expect(range.headerFields[HTTPField.Name("X-Cache")!] == "BYPASS")
        #expect(upstream.calls == 3)
    }

    @Test("responses without Date get one; the upstream's Age counts towards the entry's age")
    func dateAndAge() async throws {
        let cache = cache()
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60"), ("Age", "50")]))
        _ = try await send(cache, upstream)
        let (hit, _) = try await send(cache, upstream)
        #expect(hit.headerFields[.date] == HTTPDate.format(CacheFixture.start))
        #expect(hit.headerFields[.age] == "50" && hit.cacheStatus == "portico; hit; ttl=10")
        clock.advance(by: .seconds(10))
        _ = try await send(cache, upstream)
        #expect(upstream.calls == 2)
    }
}
