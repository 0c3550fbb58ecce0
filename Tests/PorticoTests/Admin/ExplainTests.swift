import Foundation
import Testing
@testable import Portico

@Suite("portico explain")
struct ExplainTests {
    static let yaml = """
        listen: { request_timeout: 20s }
        upstreams:
          api: { url: "http://127.0.0.1:9000/base", transport: nio, timeout: 5s }
        credentials:
          keyed: { type: static, header: X-API-Key, value: key-value-not-to-show }
        middleware:
          log: { type: access_log, redact_query: [token] }
          limit: { type: rate_limit, key: [route, "header:X-Client"], rate: 10/s, burst: 20 }
          cache: { type: cache, max_bytes: 1MiB }
          retry: { type: retry, attempts: 2, per_try_timeout: 2s }
          auth: { type: auth, credential: keyed }
          gzip: { type: compress }
        routes:
          - name: hosted
            match: { host: "*.example.com", path_prefix: /api/ }
            upstream: api
          - name: exact
            match: { path: /api/special }
            upstream: api
          - name: writes
            match: { path_prefix: /api/orders, methods: [POST] }
            upstream: api
          - name: api
            match: { path_prefix: /api/ }
            upstream: api
            strip_prefix: true
            timeout: 10s
            middleware: [log, limit, gzip, cache, retry, auth]
          - name: ping
            match: { path: /ping }
            direct: { body: pong }
        """

    static func runtime(_ yaml: String = yaml) throws -> GatewayRuntime {
        try GatewayRuntime(config: try load(yaml), logger: quietLogger)
    }

    @Test("the more specific routes say why they did not match: host, exact path, method; the rest are not considered")
    func mismatchReasons() async throws {
        let runtime = try Self.runtime()
        let explanation = try Explanation(method: "GET", url: "http://other.test/api/orders/7?token=abc&page=2",
                                          headers: ["X-Client: c1", "Accept-Encoding: gzip"], runtime: runtime)
        #expect(explanation.outcome == .route("api"))
        let verdicts = Dictionary(uniqueKeysWithValues: explanation.candidates.map { ($0.route, $0.verdict) })
        #expect(verdicts["hosted"] == .hostMismatch(pattern: "*.example.com", host: "other.test"))
        #expect(verdicts["exact"] == .pathMismatch(path: "/api/special"))
        #expect(verdicts["writes"] == .methodNotAllowed(method: "GET", allowed: ["POST"]))
        #expect(verdicts["api"] == .chosen)
        // Most specific first: the host route, the exact paths, then the longer prefix.
        #expect(explanation.candidates.map(\.route) == ["hosted", "exact", "ping", "writes", "api"])
        let text = explanation.text
        #expect(text.contains("✗ hosted (any method host *.example.com prefix /api/): host \"other.test\" is not *.example.com"))
        #expect(text.contains("✗ writes (POST prefix /api/orders): method GET is not in [POST]"))
        #expect(text.contains("✓ api (any method prefix /api/)"))

        // A POST takes the more specific prefix; the wider one matches too but is outranked.
        let post = try Explanation(method: "POST", url: "/api/orders", runtime: runtime)
        #expect(post.outcome == .route("writes"))
        #expect(post.candidates.first { $0.route == "api" }?.verdict == .outranked(by: "writes"))
        #expect(post.candidates.first { $0.route == "hosted" }?.verdict == .hostMismatch(pattern: "*.example.com", host: "localhost"))

        let nowhere = try Explanation(method: "GET", url: "/nothing", runtime: runtime)
        #expect(nowhere.outcome == .notFound)
        #expect(nowhere.candidates.first { $0.route == "api" }?.verdict == .prefixMismatch(prefix: "/api/"))
        #expect(nowhere.chain.isEmpty && nowhere.upstreamURL == nil)
        #expect(nowhere.text.contains("Routing: no route: 404 not_found"))
        await runtime.shutdown()
    }

    @Test("each step says what it would do with the request; the upstream URL is stripped; deadlines name their source")
    func chainLines() async throws {
        let runtime = try Self.runtime()
        let explanation = try Explanation(method: "GET", url: "http://other.test/api/orders/7?token=abc&page=2",
                                          headers: ["X-Client: c1", "Accept-Encoding: gzip"], runtime: runtime)
        let actions = Dictionary(uniqueKeysWithValues: explanation.chain.map { ($0.name, $0.description.action ?? "") })
        #expect(explanation.chain.map(\.name) == ["log", "limit", "gzip", "cache", "retry", "auth"])
        #expect(actions["log"]?.contains("the value of token in the query redacted") == true)
        #expect(actions["limit"]?.contains("bucket of key \"api + c1\" (route + header:x-client): 20 at once, refilled at 10/s") == true,
                "\(actions["limit"] ?? "")")
        #expect(actions["gzip"]?.hasPrefix("the client allows gzip (Accept-Encoding: gzip)") == true)
        #expect(actions["cache"] == "would look up key \"other.test/api/orders/7?token=abc&page=2\": 0 stored variants now")
        #expect(actions["retry"] == "up to 2 attempts while the retry budget allows")
        #expect(actions["auth"]?.hasPrefix("sets X-API-Key from credential keyed") == true)
        #expect(explanation.upstreamURL == "http://127.0.0.1:9000/base/orders/7?token=abc&page=2")
        #expect(explanation.deadlines?.totalSeconds == 10 && explanation.deadlines?.totalFrom == "routes[api].timeout")
        #expect(explanation.deadlines?.perTrySeconds == 2 && explanation.deadlines?.perTryFrom == "middleware.retry.per_try_timeout")
        let text = explanation.text
        #expect(text.contains("  GET http://127.0.0.1:9000/base/orders/7?token=abc&page=2"))
        #expect(text.contains("Deadlines: total 10s (routes[api].timeout)"))
        #expect(text.contains("  per try 2s (middleware.retry.per_try_timeout)"))
        #expect(text.contains("may answer at once: 429 rate_limited when the bucket is empty"))

        // Without gzip in Accept-Encoding, a POST (not retried, invalidating), a missing key header.
        let post = try Explanation(method: "POST", url: "http://other.test/api/x", headers: ["Authorization: Bearer mine"], runtime: runtime)
        let postActions = Dictionary(uniqueKeysWithValues: post.chain.map { ($0.name, $0.description.action ?? "") })
        #expect(postActions["gzip"] == "the client does not allow gzip (no Accept-Encoding): responses go as they are")
        #expect(postActions["retry"] == "sends POST once: not in methods [GET, HEAD, OPTIONS, PUT, DELETE]")
        #expect(postActions["cache"] == "forwards POST; a success invalidates key \"other.test/api/x\"")
        // ...and never says a POST may be a hit.
        #expect(post.chain.first { $0.name == "cache" }?.description.answersAtOnce == nil)
        #expect(!post.text.contains("a fresh stored response (hit)"))
        #expect(postActions["limit"] == "takes a token from the bucket all requests without route + header:x-client share")
        // Neither the credential's value nor a client's Authorization is ever shown.
        let shown = post.text + String(decoding: post.json, as: UTF8.self) + explanation.text
        #expect(!shown.contains("key-value-not-to-show") && !shown.contains("Bearer mine"))
        #expect(post.asked.headers.contains("Authorization: [REDACTED]"))
        await runtime.shutdown()
    }

    @Test("a direct route: no upstream, the total deadline from listen.request_timeout; bad input is an error value")
    func directAndErrors() async throws {
        let runtime = try Self.runtime()
        let ping = try Explanation(method: "GET", url: "/ping", runtime: runtime)
        #expect(ping.endpoint?.kind == "direct" && ping.upstreamURL == nil)
        #expect(ping.deadlines?.totalFrom == "listen.request_timeout" && ping.deadlines?.perTrySeconds == nil)
        #expect(throws: ExplainError.invalidURL("ftp://x/")) { try Explanation(method: "GET", url: "ftp://x/", runtime: runtime) }
        #expect(throws: ExplainError.invalidHeader("NoColon")) {
            try Explanation(method: "GET", url: "/ping", headers: ["NoColon"], runtime: runtime)
        }
        #expect(throws: ExplainError.refused("dot segments are not allowed in the request path")) {
            try Explanation(method: "GET", url: "/api/../admin", runtime: runtime)
        }
        await runtime.shutdown()
    }

    @Test("the route table lists match, endpoint, chain in order and what can answer at once")
    func routeTable() async throws {
        let runtime = try Self.runtime()
        let table = RouteTable(runtime)
        #expect(table.routes.map(\.name) == ["hosted", "exact", "writes", "api", "ping"])
        let api = try #require(table.routes.first { $0.name == "api" })
        #expect(api.chain.map(\.type) == ["access_log", "rate_limit", "compress", "cache", "retry", "auth"])
        #expect(api.answersAtOnce == ["limit: 429 rate_limited when the bucket is empty", "cache: a fresh stored response (hit)"])
        #expect(api.endpoint == RouteTable.Endpoint(kind: "upstream", upstream: "api", url: "http://127.0.0.1:9000/base", transport: "nio"))
        #expect(api.stripPrefix && api.timeoutSeconds == 10)
        #expect(table.routes.last?.answersAtOnce == ["direct response 200"])
        let json = String(decoding: AdminJSON.encode(table), as: UTF8.self)
        #expect(json.contains("\"answers_at_once\":\"a fresh stored response (hit)\""))
        #expect(json.contains("\"settings\":\"key route + header:x-client, 10/s, burst 20, missing key: shared\""))
        #expect(!json.contains("key-value-not-to-show"))
        await runtime.shutdown()
    }

    /// A URL `route` matches: its host pattern made concrete, its exact path or its prefix plus a segment.
    static func url(for route: RouteConfig) -> (method: String, url: String) {
        let host = route.match.host.map { $0.replacingOccurrences(of: "*.", with: "any.") } ?? "gateway.test"
        let path = route.match.path ?? (route.match.pathPrefix.map { $0.hasSuffix("/") ? $0 + "x" : $0 + "/x" } ?? "/")
        return (route.match.methods.first ?? "GET", "http://\(host)\(path)")
    }

    @Test("every route of config/portico.yaml is explained as itself")
    func everyShippedRoute() async throws {
        let path = ShippedConfigTests.root.appendingPathComponent("config/portico.yaml").path
        let config = try ConfigLoader.load(file: path, environment: [:])
        let runtime = try GatewayRuntime(config: config, logger: quietLogger)
        for route in config.routes {
            let (method, url) = Self.url(for: route)
            let explanation = try Explanation(method: method, url: url, headers: ["Accept-Encoding: gzip"], runtime: runtime)
            #expect(explanation.outcome == .route(route.name), "\(method) \(url)")
            #expect(explanation.chain.map(\.name) == (route.middleware ?? config.defaults.middleware))
            #expect(explanation.chain.allSatisfy { $0.description.action != nil }, "\(route.name)")
            #expect(explanation.deadlines != nil)
            #expect(explanation.text.contains("✓ \(route.name) "))
        }
        await runtime.shutdown()
    }

    @Test("on_limit: wait says a request over the limit waits up to max_wait (max_waiting at once); provider_limits says the learned budget is spent first")
    func pacing() async throws {
        let runtime = try Self.runtime("""
            upstreams:
              vendor:
                url: "http://127.0.0.1:9000"
                transport: nio
                provider_limits: { scope: "header:x-api-key", when_exhausted: wait, max_wait: 8s }
              plain: { url: "http://127.0.0.1:9001" }
            middleware:
              pace: { type: rate_limit, key: route, rate: 5/s, burst: 5, on_limit: wait, max_wait: 3s, max_waiting: 40 }
            routes:
              - { name: vendor, match: { path_prefix: /v/ }, upstream: vendor, middleware: [pace] }
              - { name: plain, match: { path_prefix: /p/ }, upstream: plain, middleware: [] }
            """)
        let vendor = try Explanation(method: "GET", url: "/v/items", runtime: runtime)
        let pace = try #require(vendor.chain.first { $0.name == "pace" }?.description)
        #expect(pace.settings.hasSuffix("on limit: wait up to 3s, max waiting 40"), "\(pace.settings)")
        #expect(pace.action?.contains("over the limit a request waits for its token up to 3s") == true, "\(pace.action ?? "")")
        #expect(pace.action?.contains("at most 40 waiting at once") == true)
        #expect(pace.answersAtOnce == "429 rate_limited when the token is further away than 3s or 40 requests already wait")
        let limits = try #require(vendor.providerLimits)
        #expect(limits.hasPrefix("spends the provider's learned budget before forwarding (scope header:x-api-key"), "\(limits)")
        #expect(limits.contains("waits for the provider's reset up to 8s"))
        #expect(limits.contains("(when_exhausted: wait)"))
        #expect(vendor.text.contains("  provider limits: spends the provider's learned budget before forwarding"))
        #expect(String(decoding: vendor.json, as: UTF8.self).contains("\"provider_limits\":\"spends the provider"))
        // An upstream without provider_limits says nothing of them; reject says 429 at once.
        let plain = try Explanation(method: "GET", url: "/p/items", runtime: runtime)
        #expect(plain.providerLimits == nil && !plain.text.contains("provider limits"))
        var rejecting = ProviderLimitsConfig()
        rejecting.whenExhausted = .reject
        rejecting.scope = .route
        #expect(Explanation.describe(rejecting).contains("scope route, one budget per route"))
        #expect(Explanation.describe(rejecting).contains("the request gets 429 at once (when_exhausted: reject)"))
        await runtime.shutdown()
    }
}
