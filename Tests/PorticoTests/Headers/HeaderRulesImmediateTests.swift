import Foundation
import HTTPTypes
import MicroHTTPD
import Portico
import PorticoTesting
import Testing

/// `headers` never turns the answer-at-once path off: a cache hit behind it is answered on the
/// server's thread, with its response rules applied.
@Suite("header rules on the answer-at-once path")
struct HeaderRulesImmediateTests {
    let clock = ManualClock()

    static func rules() throws -> HeadersConfig {
        let environment: [String: String] = [:]
        return HeadersConfig(
            request: HeaderRules(set: [.init(name: HTTPField.Name("X-Stamp")!, value: try HeaderTemplate(parsing: "${request_id}", environment: environment))]),
            response: HeaderRules(remove: [HTTPField.Name("Server")!],
                                  set: [.init(name: HTTPField.Name("X-Id")!, value: try HeaderTemplate(parsing: "${request_id}", environment: environment))]))
    }

    @Test("a chain with headers before a cache answers a hit at once, rules applied; a miss leaves no trace")
    func chain() async throws {
        let headers = HeadersMiddleware(try Self.rules())
        let cache = CacheMiddleware(name: "c", CacheConfig())
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60"), ("Server", "up")], body: "stored"))
        let chain = MiddlewareChain([headers, cache], endpoint: ImmediateAnswerTests.Upstream(next: upstream.next))
        #expect(chain.answersImmediately)
        var context = CacheFixture.context(clock)
        context.requestID = "miss-1"
        #expect(try chain.respondImmediately(to: CacheFixture.request(), context: context) == nil)
        let miss = try await chain.respond(to: CacheFixture.request(), context: context)
        #expect(miss.headerFields[HTTPField.Name("X-Id")!] == "miss-1")
        #expect(miss.headerFields[HTTPField.Name("Server")!] == nil)
        #expect(upstream.calls == 1)

        context.requestID = "hit-2"
        let hit = try #require(try chain.respondImmediately(to: CacheFixture.request(), context: context))
        #expect(hit.text == "stored")
        #expect(hit.headerFields[HTTPField.Name("X-Id")!] == "hit-2")
        #expect(hit.headerFields[HTTPField.Name("Server")!] == nil)
        #expect(upstream.calls == 1)
    }

    @Test("the gateway answers a hit behind headers at once, before any task")
    func gateway() async throws {
        let upstream = TestUpstream()
        upstream.route("/cached/item", TestUpstream.Response(headers: [("Cache-Control", "max-age=60")], body: "item"))
        try await upstream.start()
        var config = PorticoConfig()
        config.upstreams["app"] = UpstreamConfig(name: "app", url: URL(string: "http://127.0.0.1:\(upstream.port)")!)
        config.middleware["stamp"] = .headers(try Self.rules())
        config.middleware["cache"] = .cache(CacheConfig())
        config.routes = [RouteConfig(name: "cached", match: .init(pathPrefix: "/cached/"), upstream: "app", middleware: ["stamp", "cache"])]
        let runtime = try GatewayRuntime(config: config, logger: CacheFixture.logger)
        let gateway = Gateway(runtime: runtime, logger: CacheFixture.logger)
        func request(_ id: String) -> ServerRequest {
            ServerRequest(method: "GET", target: "/cached/item", headers: [("Host", "gw.test"), ("X-Request-ID", id)], clientAddress: "127.0.0.1")
        }
        if case .now = gateway.answer(request("a")) { Issue.record("a miss was answered at once") }
        #expect(await gateway.handle(request("a")).status == 200)
        guard case .now(let hit) = gateway.answer(request("b")) else {
            Issue.record("a fresh cache hit behind headers was not answered at once")
            return
        }
        #expect(hit.headers.contains { $0.name == "X-Id" && $0.value == "b" })
        #expect(hit.headers.contains { $0.name == "Cache-Status" && $0.value.contains("hit") })
        #expect(upstream.hits("/cached/item") == 1)
        await runtime.shutdown()
        await upstream.shutdown()
    }
}
