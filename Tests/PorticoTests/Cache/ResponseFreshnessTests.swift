import Foundation
import Portico
import Testing

@Suite("Freshness lifetime and age (RFC 9111 §4.2)")
struct ResponseFreshnessTests {
    let now = CacheFixture.start

    func freshness(_ headers: [(String, String)], status: Int = 200, requestTime: Date? = nil, responseTime: Date? = nil,
                   heuristic: Double = 0) -> ResponseFreshness {
        ResponseFreshness(status: status, headerFields: CacheFixture.fields(headers), requestTime: requestTime ?? now,
                          responseTime: responseTime ?? now, heuristicFraction: heuristic, heuristicMax: .seconds(3600))
    }

    @Test("s-maxage wins over max-age, which wins over Expires")
    func precedence() {
        let expires = HTTPDate.format(now.addingTimeInterval(1000))
        #expect(freshness([("Cache-Control", "max-age=10, s-maxage=20"), ("Expires", expires)]).lifetime == .seconds(20))
        #expect(freshness([("Cache-Control", "max-age=10"), ("Expires", expires)]).lifetime == .seconds(10))
        #expect(freshness([("Expires", expires), ("Date", HTTPDate.format(now))]).lifetime == .seconds(1000))
    }

    @Test("Expires counts from Date, not from the local clock")
    func expiresFromDate() {
        let date = now.addingTimeInterval(-500)  // the origin's clock is behind
        let f = freshness([("Date", HTTPDate.format(date)), ("Expires", HTTPDate.format(date.addingTimeInterval(60)))])
        #expect(f.lifetime == .seconds(60))
        #expect(f.initialAge == .seconds(500))  // apparent age
    }

    @Test("an invalid or conflicting Expires, or an invalid max-age, makes the response stale")
    func invalidMeansStale() {
        #expect(freshness([("Expires", "0")]).lifetime == .zero)
        #expect(freshness([("Expires", HTTPDate.format(now.addingTimeInterval(60))),
                           ("Expires", HTTPDate.format(now.addingTimeInterval(90)))]).lifetime == .zero)
        // An invalid max-age is not rescued by a valid Expires.
        #expect(freshness([("Cache-Control", "max-age=x"), ("Expires", HTTPDate.format(now.addingTimeInterval(60)))]).lifetime == .zero)
        #expect(freshness([("Cache-Control", "max-age=10, max-age=20")]).lifetime == .zero)
    }

    @Test("initial age: the larger of apparent age and Age plus the response delay")
    func initialAge() {
        let requested = now.addingTimeInterval(-3)
        let f = freshness([("Cache-Control", "max-age=60"), ("Age", "10"), ("Date", HTTPDate.format(now))],
                          requestTime: requested, responseTime: now)
        #expect(f.initialAge == .seconds(13))
        #expect(f.age(residentFor: .seconds(7)) == .seconds(20))
        #expect(f.isFresh(atAge: .seconds(59)) && !f.isFresh(atAge: .seconds(60)))
        // A malformed Age is ignored.
        #expect(freshness([("Age", "ten")]).initialAge == .zero)
        #expect(freshness([("Age", "a7200")]).initialAge == .zero)
        #expect(freshness([("Age", "7200.0")]).initialAge == .zero)
    }

    @Test("several Age values: the first counts, as in the field line `7200, 0` or two lines; a parameter is dropped")
    func firstAge() {
        let date = ("Date", HTTPDate.format(now))
        #expect(freshness([("Age", "7200, 0"), date]).initialAge == .seconds(7200))
        #expect(freshness([("Age", "7200,0"), date]).initialAge == .seconds(7200))
        #expect(freshness([("Age", "7200"), ("Age", "0"), date]).initialAge == .seconds(7200))
        #expect(freshness([("Age", "0"), ("Age", "7200"), date]).initialAge == .zero)
        #expect(freshness([("Age", "7200;foo=bar"), date]).initialAge == .seconds(7200))
        #expect(freshness([("Age", " 7200 , 1"), date]).initialAge == .seconds(7200))
        // A line that starts with an empty element has no first value (as before the list parser).
        #expect(freshness([("Age", ", 7200"), date]).initialAge == .zero)
    }

    @Test("heuristic freshness: a fraction of the time since Last-Modified, capped, off by default")
    func heuristic() {
        let headers = [("Date", HTTPDate.format(now)), ("Last-Modified", HTTPDate.format(now.addingTimeInterval(-10_000)))]
        #expect(freshness(headers).lifetime == .zero)
        let on = freshness(headers, heuristic: 0.1)
        #expect(on.lifetime == .seconds(1000) && on.heuristic)
        #expect(freshness([("Date", HTTPDate.format(now)), ("Last-Modified", HTTPDate.format(now.addingTimeInterval(-1_000_000)))],
                          heuristic: 0.1).lifetime == .seconds(3600))
        // Only for heuristically cacheable statuses (or public), never over an explicit lifetime.
        #expect(freshness(headers, status: 302, heuristic: 0.1).lifetime == .zero)
        #expect(freshness(headers + [("Cache-Control", "public")], status: 302, heuristic: 0.1).lifetime == .seconds(1000))
        #expect(freshness(headers + [("Cache-Control", "max-age=5")], heuristic: 0.1).lifetime == .seconds(5))
    }

    @Test("response directives that limit reuse")
    func directives() {
        let f = freshness([("Cache-Control", #"no-cache="Set-Cookie", s-maxage=5, stale-while-revalidate=30, stale-if-error=60, immutable"#)])
        #expect(!f.noCache && f.noCacheFields == ["set-cookie"])
        #expect(f.mustRevalidate && f.sharedWithAuthorization && f.immutable)
        #expect(f.staleWhileRevalidate == .seconds(30) && f.staleIfError == .seconds(60))
        #expect(freshness([("Cache-Control", "no-cache")]).noCache)
        #expect(freshness([("Cache-Control", "proxy-revalidate")]).mustRevalidate)
        #expect(!freshness([("Cache-Control", "max-age=5")]).mustRevalidate)
        #expect(freshness([("Cache-Control", "stale-if-error=x")]).staleIfError == nil)
    }
}
