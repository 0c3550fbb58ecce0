import Foundation
import HTTPTypes
import Logging
import MicroHTTPD
import Portico
import PorticoTesting
import Synchronization
import Testing

/// Answering at once, on the server's thread: which chains can, what a hit costs, and that a
/// request the chain cannot answer at once is handled later exactly as before (charged once,
/// counted once, logged once).
@Suite("Answers given at once")
struct ImmediateAnswerTests {
    /// Counts how often each path reached it; answers through `next`.
    struct Probe: ImmediateMiddleware {
        final class Calls: Sendable {
            let counts = Mutex<(immediate: Int, later: Int)>((0, 0))
            func withLock<R>(_ body: (inout (immediate: Int, later: Int)) -> R) -> R { counts.withLock { body(&$0) } }
        }
        let calls = Calls()

        func handle(_ request: GatewayRequest, context: RequestContext, next: @escaping NextHandler) async throws -> GatewayResponse {
            calls.withLock { $0.later += 1 }
            return try await next(request, context)
        }

        func handleImmediately(_ request: GatewayRequest, context: RequestContext,
                               next: ImmediateNextHandler) throws -> GatewayResponse? {
            calls.withLock { $0.immediate += 1 }
            return try next(request, context)
        }
    }

    /// A middleware with only the task path.
    struct Plain: Middleware {
        func handle(_ request: GatewayRequest, context: RequestContext, next: @escaping NextHandler) async throws -> GatewayResponse {
            try await next(request, context)
        }
    }

    let clock = ManualClock()
    var context: RequestContext { CacheFixture.context(clock) }
    let direct = DirectResponder(status: 200, headers: [("Content-Type", "text/plain")], body: "direct")

    @Test("a chain answers at once only through middleware that can, down to an endpoint or a step that answers")
    func chainRules() async throws {
        let probe = Probe()
        let throughProbe = MiddlewareChain([probe], endpoint: direct)
        #expect(throughProbe.answersImmediately)
        #expect(try throughProbe.respondImmediately(to: CacheFixture.request(), context: context)?.text == "direct")
        #expect(probe.calls.withLock { $0.immediate } == 1)

        // A plain middleware outside: nothing at once, the probe is not even asked.
        let plainOutside = MiddlewareChain([Plain(), probe], endpoint: direct)
        #expect(!plainOutside.answersImmediately)
        #expect(try plainOutside.respondImmediately(to: CacheFixture.request(), context: context) == nil)
        #expect(probe.calls.withLock { $0.immediate } == 1)

        // A plain middleware inside: the probe is asked, gets no answer, and so gives none.
        let plainInside = MiddlewareChain([probe, Plain()], endpoint: direct)
        #expect(try plainInside.respondImmediately(to: CacheFixture.request(), context: context) == nil)
        #expect(probe.calls.withLock { $0.immediate } == 2)
        // …and the task path still works, through both.
        #expect(try await plainInside.respond(to: CacheFixture.request(), context: context).text == "direct")
        #expect(probe.calls.withLock { $0.later } == 1)
    }

    @Test("a fresh hit is answered at once and counted once; a miss is left untouched for the task")
    func cacheHit() async throws {
        let metrics = RecordingMetrics()
        let cache = CacheMiddleware(name: "test", CacheConfig(), metrics: CacheMetrics(cache: "test", factory: metrics))
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")], body: "stored"))
        let chain = MiddlewareChain([cache], endpoint: Upstream(next: upstream.next))

        // Miss: no answer at once, no metric, no upstream call; the task path fetches and stores.
        #expect(try chain.respondImmediately(to: CacheFixture.request(), context: context) == nil)
        #expect(metrics.value("portico_cache_misses_total") == 0)
        #expect(upstream.calls == 0)
        let miss = try await chain.respond(to: CacheFixture.request(), context: context)
        #expect(miss.cacheStatus?.contains("fwd=uri-miss") == true)
        #expect(metrics.value("portico_cache_misses_total") == 1)

        // Hit: at once, with Age and Cache-Status, counted once.
        clock.advance(by: .seconds(5))
        let hit = try #require(try chain.respondImmediately(to: CacheFixture.request(), context: context))
        #expect(hit.text == "stored")
        #expect(hit.cacheStatus?.hasSuffix("hit; ttl=55") == true)
        #expect(hit.headerFields[.age] == "5")
        #expect(metrics.value("portico_cache_hits_total") == 1)
        #expect(upstream.calls == 1)

        // HEAD from the stored GET, at once, without a body.
        let head = try #require(try chain.respondImmediately(to: CacheFixture.request(.head), context: context))
        #expect(head.body.count ?? 0 == 0)

        // The client's own validator against a fresh entry: 304 at once.
        let etagged = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60"), ("ETag", "\"v1\"")]))
        let etagChain = MiddlewareChain([CacheMiddleware(name: "etag", CacheConfig())], endpoint: Upstream(next: etagged.next))
        _ = try await etagChain.respond(to: CacheFixture.request(), context: context)
        let conditional = CacheFixture.request(headers: [("If-None-Match", "\"v1\"")])
        #expect(try etagChain.respondImmediately(to: conditional, context: context)?.status == .notModified)

        // Stale: validation needs the upstream, so nothing at once and nothing counted.
        clock.advance(by: .seconds(60))
        #expect(try chain.respondImmediately(to: CacheFixture.request(), context: context) == nil)
        #expect(metrics.value("portico_cache_hits_total") == 2)  // the GET and the HEAD
        #expect(metrics.value("portico_cache_misses_total") == 1)
    }

    @Test("stale-while-revalidate, Range and unsafe methods always go to the task")
    func notAtOnce() async throws {
        let cache = CacheMiddleware(name: "test", CacheConfig())
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=1, stale-while-revalidate=60")]))
        let chain = MiddlewareChain([cache], endpoint: Upstream(next: upstream.next))
        _ = try await chain.respond(to: CacheFixture.request(), context: context)
        #expect(try chain.respondImmediately(to: CacheFixture.request(), context: context) != nil)
        #expect(try chain.respondImmediately(to: CacheFixture.request(headers: [("Range", "bytes=0-1")]), context: context) == nil)
        #expect(try chain.respondImmediately(to: CacheFixture.request(.post), context: context) == nil)
        clock.advance(by: .seconds(2))
        // Serving stale starts a background refresh: that is the task path's job.
        #expect(try chain.respondImmediately(to: CacheFixture.request(), context: context) == nil)
        #expect(upstream.calls == 1)
    }

    @Test("a rate limit before the cache charges a request once, whether it is answered at once or later")
    func rateLimitChargedOnce() async throws {
        let limit = RateLimitMiddleware(name: "limit", RateLimitConfig(rate: Rate(count: 1, per: .seconds(3600)), burst: 2))
        let cache = CacheMiddleware(name: "test", CacheConfig())
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")]))
        let chain = MiddlewareChain([limit, cache], endpoint: Upstream(next: upstream.next))
        let request = CacheFixture.request(headers: [("X-Client", "a")])

        // 1: a miss. The at-once attempt takes the token and hands it to the task path.
        let first = context
        #expect(try chain.respondImmediately(to: request, context: first) == nil)
        let miss = try await chain.respond(to: request, context: first)
        #expect(miss.status == .ok)
        #expect(miss.headerFields[RateLimitHeaders.stateName]?.contains("r=1") == true)

        // 2: a hit, at once, with the last token.
        let hit = try #require(try chain.respondImmediately(to: request, context: context))
        #expect(hit.headerFields[RateLimitHeaders.stateName]?.contains("r=0") == true)

        // 3: refused at once.
        #expect(throws: GatewayError.self) { try chain.respondImmediately(to: request, context: context) }
        #expect(upstream.calls == 1)
    }

    @Test("the gateway answers direct routes, cache hits and routing errors at once, and upstream work later")
    func gatewayAnswers() async throws {
        let upstream = TestUpstream()
        upstream.route("/cached/item", TestUpstream.Response(headers: [("Cache-Control", "max-age=60")], body: "item"))
        try await upstream.start()
        var config = PorticoConfig()
        config.upstreams["app"] = UpstreamConfig(name: "app", url: URL(string: "http://127.0.0.1:\(upstream.port)")!)
        config.middleware["cache"] = .cache(CacheConfig())
        config.routes = [
            RouteConfig(name: "hello", match: .init(path: "/hello"), direct: .init(status: 200, body: "hi")),
            RouteConfig(name: "cached", match: .init(pathPrefix: "/cached/"), upstream: "app", middleware: ["cache"]),
            RouteConfig(name: "proxied", match: .init(pathPrefix: "/proxied/"), upstream: "app"),
        ]
        let runtime = try GatewayRuntime(config: config, logger: CacheFixture.logger)
        let gateway = Gateway(runtime: runtime, logger: CacheFixture.logger)
        func request(_ target: String) -> ServerRequest {
            ServerRequest(method: "GET", target: target, headers: [("Host", "gw.test")], clientAddress: "127.0.0.1")
        }
        func isNow(_ answer: HTTPServer.Answer) -> Bool {
            if case .now = answer { return true }
            return false
        }

        #expect(isNow(gateway.answer(request("/hello"))))
        #expect(isNow(gateway.answer(request("/nowhere"))))
        #expect(!isNow(gateway.answer(request("/proxied/x"))))
        let target = "/cached/item"
        #expect(!isNow(gateway.answer(request(target))))
        #expect(await gateway.handle(request(target)).status == 200)
        guard case .now(let hit) = gateway.answer(request(target)) else {
            Issue.record("a fresh cache hit was not answered at once")
            return
        }
        #expect(hit.headers.contains { $0.name == "Cache-Status" && $0.value.contains("hit") })
        #expect(hit.body == Array("item".utf8))
        await runtime.shutdown()
        await upstream.shutdown()
    }

    /// An endpoint calling a test's `next`.
    struct Upstream: Responder {
        let next: NextHandler
        func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
            try await next(request, context)
        }
    }
}
