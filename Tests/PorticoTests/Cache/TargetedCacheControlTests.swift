import HTTPTypes
import Portico
import PorticoTesting
import Testing

@Suite("Targeted cache control: CDN-Cache-Control and friends (RFC 9213)")
struct TargetedCacheControlTests {
    static let cdn = HTTPField.Name("CDN-Cache-Control")!
    static let own = HTTPField.Name("Portico-Cache-Control")!
    let clock = ManualClock()

    func governing(_ headers: [(String, String)], targets: [HTTPField.Name] = [cdn]) -> ResponseCacheControl {
        ResponseCacheControl(CacheFixture.fields(headers), targets: targets)
    }

    @Test("the first listed field with a valid, non-empty value governs; Cache-Control otherwise")
    func selection() {
        let both = [("Cache-Control", "no-store"), ("CDN-Cache-Control", "max-age=60"), ("Portico-Cache-Control", "max-age=5")]
        #expect(governing(both).targetedField == Self.cdn)
        #expect(governing(both).directives.seconds("max-age") == .value(60))
        #expect(!governing(both).directives.contains("no-store"))
        #expect(governing(both, targets: [Self.own, Self.cdn]).directives.seconds("max-age") == .value(5))
        // Not configured: the field changes nothing.
        #expect(governing(both, targets: []).targetedField == nil)
        #expect(governing(both, targets: []).directives.contains("no-store"))
        // Absent, empty or unparseable fields fall through to the next, then to Cache-Control.
        for value in ["", "  ", "max-age =100", "max-age= 100", "MaX-aGe=3600", "max-age=10000, &&&&&"] {
            let fallback = governing([("Cache-Control", "max-age=1"), ("CDN-Cache-Control", value)])
            #expect(fallback.targetedField == nil, "\(value)")
            #expect(fallback.directives.seconds("max-age") == .value(1), "\(value)")
            #expect(fallback.honoursExpires)
        }
        let next = governing([("Portico-Cache-Control", "max-age=x y"), ("CDN-Cache-Control", "max-age=9")],
                             targets: [Self.own, Self.cdn])
        #expect(next.targetedField == Self.cdn && !next.honoursExpires)
    }

    @Test("members map onto directives; wrongly typed values are malformed, not consumed")
    func members() {
        let d = governing([("CDN-Cache-Control", #"foobar, max-age=3600;p=1, private="Set-Cookie", no-store=?0"#)]).directives
        #expect(d.seconds("max-age") == .value(3600))
        #expect(d.contains("foobar"))
        #expect(d.fieldNames("private") == ["set-cookie"])
        #expect(!d.contains("no-store"))
        // Several lines are one dictionary.
        let lines = governing([("CDN-Cache-Control", "max-age=30"), ("CDN-Cache-Control", "must-revalidate")]).directives
        #expect(lines.seconds("max-age") == .value(30) && lines.contains("must-revalidate"))
        // Large values saturate like delta-seconds.
        #expect(governing([("CDN-Cache-Control", "max-age=99999999999")]).directives.seconds("max-age")
            == .value(CacheControl.maxDeltaSeconds))
        for value in [#"max-age="10000""#, "max-age=1.5", "max-age=-1", "max-age", "max-age=(1 2)", "s-maxage=abc"] {
            let name: CacheControl.Name = value.hasPrefix("s-") ? .sMaxAge : .maxAge
            #expect(governing([("CDN-Cache-Control", value)]).directives.seconds(name) == .invalid, "\(value)")
        }
    }

    @Test("a governing targeted field sets the lifetime and silences Cache-Control and Expires")
    func freshness() {
        let later = CacheFixture.httpDate(CacheFixture.start.addingTimeInterval(10_000))
        let past = CacheFixture.httpDate(CacheFixture.start.addingTimeInterval(-10_000))
        let date = ("Date", CacheFixture.httpDate(CacheFixture.start))
        func lifetime(_ headers: [(String, String)]) -> Duration {
            ResponseFreshness(status: 200, headerFields: CacheFixture.fields(headers + [date]), requestTime: CacheFixture.start,
                              responseTime: CacheFixture.start, targets: [Self.cdn]).lifetime
        }
        #expect(lifetime([("CDN-Cache-Control", "max-age=3600"), ("Expires", past)]) == .seconds(3600))
        #expect(lifetime([("CDN-Cache-Control", "max-age=3600"), ("Expires", "0")]) == .seconds(3600))
        #expect(lifetime([("CDN-Cache-Control", "max-age=0"), ("Expires", later)]) == .zero)
        #expect(lifetime([("Cache-Control", "max-age=3600"), ("CDN-Cache-Control", "max-age=1")]) == .seconds(1))
        #expect(lifetime([("Cache-Control", "max-age=1"), ("CDN-Cache-Control", "max-age=3600")]) == .seconds(3600))
        // A targeted field without a lifetime leaves none, whatever Expires says.
        #expect(lifetime([("CDN-Cache-Control", "public"), ("Expires", later)]) == .zero)
        #expect(lifetime([("CDN-Cache-Control", "max-age=x y"), ("Expires", later)]) == .seconds(10_000))
    }

    @Test("storability follows the governing field: its no-store and private count, Cache-Control's do not")
    func storability() {
        let policy = CachePolicy(CacheFixture.config { $0.targetedCacheControl = [Self.cdn] })
        func verdict(_ headers: [(String, String)]) -> CachePolicy.Storability {
            let response = CacheFixture.response(headers: headers)
            let freshness = policy.freshness(status: 200, headerFields: response.headerFields,
                                             requestTime: CacheFixture.start, responseTime: CacheFixture.start)
            return policy.storability(request: RequestDirectives(), response: response, freshness: freshness)
        }
        let later = CacheFixture.httpDate(CacheFixture.start.addingTimeInterval(10_000))
        #expect(verdict([("Cache-Control", "no-store"), ("CDN-Cache-Control", "max-age=10000")]) == .store(excludingFields: []))
        #expect(verdict([("Cache-Control", "max-age=10000"), ("CDN-Cache-Control", "no-store")]) == .no(reason: "no-store"))
        #expect(verdict([("Cache-Control", "max-age=10000"), ("Expires", later), ("CDN-Cache-Control", "private")])
            == .no(reason: "private"))
        // Expires alone does not make a response explicit when a targeted field governs.
        #expect(verdict([("Expires", later), ("CDN-Cache-Control", "must-revalidate")]) == .no(reason: "stale"))
        #expect(verdict([("CDN-Cache-Control", "max-age=10000, &&&"), ("Cache-Control", "no-store")]) == .no(reason: "no-store"))
    }

    func send(_ cache: CacheMiddleware, _ upstream: ScriptedUpstream) async throws -> GatewayResponse {
        try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
    }

    @Test("through the middleware: stored for the targeted lifetime, passed on unchanged, validated like any entry")
    func middleware() async throws {
        let cache = CacheMiddleware(name: "t", CacheFixture.config { $0.targetedCacheControl = [Self.cdn] })
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? CacheFixture.response(headers: [("Cache-Control", "no-store"), ("CDN-Cache-Control", "max-age=100"),
                                                     ("ETag", "\"v1\"")])
                : CacheFixture.response(304, headers: [("CDN-Cache-Control", "max-age=50"), ("ETag", "\"v1\"")], body: "")
        }
        let first = try await send(cache, upstream)
        #expect(first.cacheStatus == "portico; fwd=uri-miss; fwd-status=200; ttl=100; stored")
        // Downstream caches still see both fields: the client's browser must not store it.
        #expect(first.headerFields[.cacheControl] == "no-store")
        #expect(first.headerFields[Self.cdn] == "max-age=100")
        clock.advance(by: .seconds(60))
        let hit = try await send(cache, upstream)
        #expect(hit.cacheStatus == "portico; hit; ttl=40")
        #expect(hit.headerFields[Self.cdn] == "max-age=100")
        clock.advance(by: .seconds(41))
        let validated = try await send(cache, upstream)
        #expect(validated.cacheStatus == "portico; fwd=stale; fwd-status=304; ttl=50; stored")
        #expect(validated.headerFields[Self.cdn] == "max-age=50")
        #expect(upstream.calls == 2)
    }

    @Test("a 304 whose targeted field says no-store drops the entry")
    func notModifiedNoStore() async throws {
        let cache = CacheMiddleware(name: "t", CacheFixture.config { $0.targetedCacheControl = [Self.cdn] })
        let upstream = ScriptedUpstream { n, _ in
            switch n {
            case 1: CacheFixture.response(headers: [("CDN-Cache-Control", "max-age=10"), ("ETag", "\"v1\"")])
            case 2: CacheFixture.response(304, headers: [("CDN-Cache-Control", "no-store"), ("Cache-Control", "max-age=999"),
                                                         ("ETag", "\"v1\"")], body: "")
            default: CacheFixture.response(headers: [("CDN-Cache-Control", "max-age=10")])
            }
        }
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(11))
        _ = try await send(cache, upstream)
        let after = try await send(cache, upstream)
        #expect(after.cacheStatus?.contains("fwd=uri-miss") == true)
        #expect(upstream.calls == 3)
    }
}
