import HTTPTypes
import Testing
@testable import Portico

private struct Named: Responder {
    let name: String
    func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        GatewayResponse(status: .ok, body: Body(string: name))
    }
}

private func route(_ name: String, path: String? = nil, prefix: String? = nil, host: String? = nil,
                   methods: [String] = [], strip: Bool = false) -> Route {
    Route(name: name, matcher: .init(path: path, pathPrefix: prefix, host: host, methods: methods),
          stripPrefix: strip, responder: Named(name: name))
}

private func matched(_ router: Router, _ path: Substring, method: HTTPRequest.Method = .get,
                     host: String? = "api.example.com") -> String {
    switch router.match(method: method, host: host, path: path) {
    case .route(let route): route.name
    case .notFound: "404"
    case .methodNotAllowed(let allow): "405 " + allow.joined(separator: ",")
    }
}

@Suite("Router")
struct RouterTests {
    let router = Router(routes: [
        route("root", prefix: "/"),
        route("api", prefix: "/api"),
        route("api-v2", prefix: "/api/v2/"),
        route("exact", path: "/api/v2/health"),
        route("hosted", prefix: "/api", host: "admin.example.com"),
        route("wild", prefix: "/w", host: "*.tenant.io"),
        route("writes", path: "/items", methods: ["POST", "PUT"]),
        route("reads", path: "/items", methods: ["GET"]),
        route("only-delete", path: "/gone", methods: ["DELETE"]),
    ])

    @Test("the longest prefix wins and an exact path beats any prefix", arguments: [
        ("/api/v2/x", "api-v2"), ("/api/v2/health", "exact"), ("/api/v1", "api"), ("/api", "api"),
        ("/apix", "root"), ("/", "root"), ("/anything/else", "root"),
    ])
    func specificity(path: String, expected: String) {
        #expect(matched(router, Substring(path)) == expected)
    }

    @Test("a host-specific route beats a host-agnostic one; ports and case are ignored")
    func hosts() {
        #expect(matched(router, "/api/x", host: "Admin.Example.com:8443") == "hosted")
        #expect(matched(router, "/api/x", host: "other.example.com") == "api")
        #expect(matched(router, "/w/1", host: "a.tenant.io") == "wild")
        #expect(matched(router, "/w/1", host: "tenant.io") == "root")
        #expect(matched(router, "/api/x", host: nil) == "api")
    }

    @Test("methods select among routes on the same path; none allowed → 405 with Allow")
    func methods() {
        #expect(matched(router, "/items", method: .post) == "writes")
        #expect(matched(router, "/items", method: .get) == "reads")
        #expect(matched(router, "/items", method: .head) == "reads")
        // Methods are part of the match: a less specific route that allows the method still answers.
        #expect(matched(router, "/gone", method: .get) == "root")
        #expect(matched(Router(routes: [route("d", path: "/gone", methods: ["DELETE"])]), "/gone", method: .get) == "405 DELETE")
        #expect(matched(Router(routes: [route("w", path: "/items", methods: ["POST", "PUT"])]), "/items", method: .delete) == "405 POST,PUT")
    }

    @Test("no route → not found")
    func notFound() {
        #expect(matched(Router(routes: [route("api", prefix: "/api")]), "/other") == "404")
    }

    @Test("strip_prefix removes the matched prefix and keeps the query", arguments: [
        ("/api", "/api/orders/1?x=%2F", "/orders/1?x=%2F"),
        ("/api/", "/api/orders", "/orders"),
        ("/api", "/api", "/"),
        ("/api", "/api?x=1", "/?x=1"),
        ("/api", "/other", "/other"),
        ("/café", "/café/menu", "/menu"),
    ])
    func stripPrefix(prefix: String, target: String, expected: String) {
        #expect(route("r", prefix: prefix, strip: true).upstreamTarget(for: target) == expected)
    }

    @Test("dot segments and odd target forms are refused", arguments: [
        "/a/../b", "/a/%2e%2E/b", "/./x", "*", "x", "/a b", "/a/..", "/a/.", "/..", "/a/.%2E?x=1", "/a/..?q",
        "/%2e/x", "/a\u{7F}", "/a?b=\u{01}",
    ])
    func refusedTargets(target: String) {
        #expect(throws: GatewayError.self) { try GatewayRequest.originForm(target) }
    }

    @Test("dots that are not whole segments, and dots in the query, are fine", arguments: [
        "/a/...", "/a/.b", "/a/b.", "/a/%2e%2e%2e", "/a%2e", "/a?x=/../", "/a/..b/c", "/%2", "/a/%2", "/a/%2f",
    ])
    func acceptedTargets(target: String) throws {
        #expect(try GatewayRequest.originForm(target) == target)
    }

    @Test("absolute-form targets are reduced to origin form")
    func absoluteForm() throws {
        #expect(try GatewayRequest.originForm("http://example.com/a?b=1") == "/a?b=1")
        #expect(try GatewayRequest.originForm("http://example.com") == "/")
        #expect(try GatewayRequest.originForm("/a%2Fb?c=+") == "/a%2Fb?c=+")
    }
}
