import Foundation
import HTTPTypes
import Portico
import PorticoTesting
import Testing

@Suite("What may be stored and reused (RFC 9111 §3, §4)")
struct CachePolicyTests {
    let policy = CachePolicy(CacheConfig())

    func storability(_ headers: [(String, String)], status: Int = 200, request: [(String, String)] = []) -> CachePolicy.Storability {
        let response = CacheFixture.response(status, headers: headers)
        let freshness = ResponseFreshness(status: status, headerFields: response.headerFields, requestTime: CacheFixture.start,
                                          responseTime: CacheFixture.start)
        return policy.storability(request: RequestDirectives(CacheFixture.fields(request)), response: response, freshness: freshness)
    }

    @Test("stored: explicit lifetimes, public, and validators on heuristically cacheable statuses")
    func stored() {
        #expect(storability([("Cache-Control", "max-age=60")]) == .store(excludingFields: []))
        #expect(storability([("Cache-Control", "max-age=60")], status: 404) == .store(excludingFields: []))
        #expect(storability([("Cache-Control", "max-age=60")], status: 302) == .store(excludingFields: []))
        #expect(storability([("ETag", "\"v1\"")]) == .store(excludingFields: []))
        #expect(storability([("Cache-Control", "no-cache"), ("ETag", "\"v1\"")]) == .store(excludingFields: []))
        #expect(storability([("Cache-Control", #"max-age=60, private="X-User""#)]) == .store(excludingFields: ["x-user"]))
    }

    struct NotStored: Sendable, CustomTestStringConvertible {
        var response: [(String, String)]
        var status = 200
        var request: [(String, String)] = []
        var reason: String
        var testDescription: String { "\(status) \(response) → \(reason)" }
    }

    @Test("not stored", arguments: [
        NotStored(response: [("Cache-Control", "no-store, max-age=60")], reason: "no-store"),
        NotStored(response: [("Cache-Control", "max-age=60")], request: [("Cache-Control", "no-store")], reason: "no-store"),
        NotStored(response: [("Cache-Control", "private, max-age=60")], reason: "private"),
        NotStored(response: [("Cache-Control", "max-age=60")], request: [("Authorization", "Bearer t")], reason: "authorization"),
        NotStored(response: [("Cache-Control", "max-age=60"), ("Vary", "Accept, *")], reason: "vary-star"),
        NotStored(response: [("Cache-Control", "max-age=60"), ("Set-Cookie", "s=1")], reason: "set-cookie"),
        NotStored(response: [("Cache-Control", "max-age=60")], status: 206, reason: "status"),
        NotStored(response: [("Cache-Control", "max-age=60")], status: 299, reason: "status"),
        NotStored(response: [("ETag", "\"v1\"")], status: 302, reason: "no-freshness"),
        NotStored(response: [], reason: "stale"),
        NotStored(response: [("Cache-Control", "max-age=0")], reason: "stale"),
        NotStored(response: [("Cache-Control", "no-cache, max-age=60")], reason: "stale"),
    ])
    func notStored(_ c: NotStored) {
        #expect(storability(c.response, status: c.status, request: c.request) == .no(reason: c.reason))
    }

    @Test("Authorization: stored when public, s-maxage or must-revalidate allow it (§3.5)")
    func authorization() {
        let auth = [("Authorization", "Bearer t")]
        for cc in ["public, max-age=60", "s-maxage=60", "must-revalidate, max-age=60"] {
            #expect(storability([("Cache-Control", cc)], request: auth) == .store(excludingFields: []))
        }
        #expect(storability([("Cache-Control", "public, max-age=60"), ("Set-Cookie", "a=b")]) == .store(excludingFields: []))
    }

    @Test("fresh entries are used; request max-age and min-fresh can refuse them")
    func freshUse() {
        let clock = ManualClock()
        let entry = CacheFixture.entry([("Cache-Control", "max-age=100")], clock: clock)
        clock.advance(by: .seconds(40))
        #expect(policy.usability(of: entry, for: RequestDirectives(), at: clock.now) == .fresh)
        func with(_ cc: String) -> RequestDirectives { RequestDirectives(CacheFixture.fields([("Cache-Control", cc)])) }
        #expect(policy.usability(of: entry, for: with("max-age=30"), at: clock.now) == .validate(.request))
        #expect(policy.usability(of: entry, for: with("max-age=50"), at: clock.now) == .fresh)
        #expect(policy.usability(of: entry, for: with("min-fresh=70"), at: clock.now) == .validate(.request))
        #expect(policy.usability(of: entry, for: with("min-fresh=50"), at: clock.now) == .fresh)
        #expect(policy.usability(of: entry, for: with("no-cache"), at: clock.now) == .validate(.request))
        clock.advance(by: .seconds(60))
        #expect(policy.usability(of: entry, for: RequestDirectives(), at: clock.now) == .validate(.stale))
    }

    @Test("an immutable fresh entry ignores a reload's max-age=0 but not no-cache")
    func immutable() {
        let clock = ManualClock()
        let entry = CacheFixture.entry([("Cache-Control", "max-age=100, immutable")], clock: clock)
        clock.advance(by: .seconds(10))
        #expect(policy.usability(of: entry, for: RequestDirectives(CacheFixture.fields([("Cache-Control", "max-age=0")])), at: clock.now) == .fresh)
        #expect(policy.usability(of: entry, for: RequestDirectives(CacheFixture.fields([("Cache-Control", "no-cache")])), at: clock.now) == .validate(.request))
    }

    @Test("max-stale accepts stale entries unless the response forbids stale use")
    func maxStale() {
        let clock = ManualClock()
        let plain = CacheFixture.entry([("Cache-Control", "max-age=10")], clock: clock)
        let strict = CacheFixture.entry([("Cache-Control", "max-age=10, must-revalidate")], clock: clock)
        let shared = CacheFixture.entry([("Cache-Control", "s-maxage=10")], clock: clock)
        clock.advance(by: .seconds(30))
        let request = RequestDirectives(CacheFixture.fields([("Cache-Control", "max-stale=25")]))
        #expect(policy.usability(of: plain, for: request, at: clock.now) == .staleAccepted)
        #expect(policy.usability(of: strict, for: request, at: clock.now) == .validate(.stale))
        #expect(policy.usability(of: shared, for: request, at: clock.now) == .validate(.stale))
        let tooStale = RequestDirectives(CacheFixture.fields([("Cache-Control", "max-stale=5")]))
        #expect(policy.usability(of: plain, for: tooStale, at: clock.now) == .validate(.stale))
        let any = RequestDirectives(CacheFixture.fields([("Cache-Control", "max-stale")]))
        #expect(policy.usability(of: plain, for: any, at: clock.now) == .staleAccepted)
    }

    @Test("no-cache responses are always validated")
    func noCacheResponse() {
        let clock = ManualClock()
        let entry = CacheFixture.entry([("Cache-Control", "no-cache, max-age=100"), ("ETag", "\"a\"")], clock: clock)
        #expect(policy.usability(of: entry, for: RequestDirectives(), at: clock.now) == .validate(.stale))
    }

    @Test("stale-while-revalidate: the response's window, else the configured fallback")
    func staleWhileRevalidate() {
        let clock = ManualClock()
        let own = CacheFixture.entry([("Cache-Control", "max-age=10, stale-while-revalidate=20")], clock: clock)
        let bare = CacheFixture.entry([("Cache-Control", "max-age=10")], clock: clock)
        clock.advance(by: .seconds(25))
        #expect(policy.usability(of: own, for: RequestDirectives(), at: clock.now) == .staleWhileRevalidate)
        #expect(policy.usability(of: bare, for: RequestDirectives(), at: clock.now) == .validate(.stale))
        let fallback = CachePolicy(CacheFixture.config { $0.staleWhileRevalidate = .seconds(60) })
        #expect(fallback.usability(of: bare, for: RequestDirectives(), at: clock.now) == .staleWhileRevalidate)
        clock.advance(by: .seconds(10))  // 25 s stale: past the response's own 20 s
        #expect(policy.usability(of: own, for: RequestDirectives(), at: clock.now) == .validate(.stale))
    }

    @Test("stale-if-error: within the window, never past must-revalidate or no-cache")
    func staleIfError() {
        let clock = ManualClock()
        let own = CacheFixture.entry([("Cache-Control", "max-age=10, stale-if-error=60")], clock: clock)
        let strict = CacheFixture.entry([("Cache-Control", "max-age=10, stale-if-error=60, must-revalidate")], clock: clock)
        let bare = CacheFixture.entry([("Cache-Control", "max-age=10")], clock: clock)
        clock.advance(by: .seconds(30))
        let none = RequestDirectives()
        #expect(policy.canServeStaleOnError(own, for: none, at: clock.now))
        #expect(!policy.canServeStaleOnError(strict, for: none, at: clock.now))
        #expect(!policy.canServeStaleOnError(bare, for: none, at: clock.now))
        #expect(CachePolicy(CacheFixture.config { $0.staleIfError = .seconds(30) }).canServeStaleOnError(bare, for: none, at: clock.now))
        #expect(!policy.canServeStaleOnError(own, for: RequestDirectives(CacheFixture.fields([("Pragma", "no-cache")])), at: clock.now))
        clock.advance(by: .seconds(41))
        #expect(!policy.canServeStaleOnError(own, for: none, at: clock.now))
    }

    @Test("a 304 replaces stored fields, keeps Content-Length, and restarts the age")
    func freshen() throws {
        let clock = ManualClock()
        let entry = CacheFixture.entry([("Cache-Control", "max-age=10"), ("ETag", "\"v1\""), ("X-Version", "1"),
                                        ("X-Keep", "yes"), ("Content-Length", "7")], clock: clock)
        clock.advance(by: .seconds(100))
        let notModified = CacheFixture.response(304, headers: [("Cache-Control", "max-age=50"), ("ETag", "\"v1\""),
                                                               ("X-Version", "2"), ("Content-Length", "0")], body: "")
        let updated = try #require(policy.freshen(entry, with: notModified, requestTime: clock.wallNow, responseTime: clock.wallNow,
                                                  now: clock.now, excludingFields: []))
        #expect(updated.headerFields[values: HTTPField.Name("X-Version")!] == ["2"])
        #expect(updated.headerFields[HTTPField.Name("X-Keep")!] == "yes")
        #expect(updated.headerFields[.contentLength] == "7")
        #expect(updated.freshness.lifetime == .seconds(50))
        #expect(policy.usability(of: updated, for: RequestDirectives(), at: clock.now) == .fresh)
        #expect(updated.body.readableBytes == 7)
        // A 304 for another strong validator does not describe this response.
        let other = CacheFixture.response(304, headers: [("ETag", "\"v2\"")], body: "")
        #expect(policy.freshen(entry, with: other, requestTime: clock.wallNow, responseTime: clock.wallNow,
                               now: clock.now, excludingFields: []) == nil)
    }
}

@Suite("Vary and conditional requests")
struct VaryAndConditionalTests {
    @Test("Vary: normalised values match; a missing field matches only a missing field; * never matches")
    func vary() throws {
        let response = CacheFixture.fields([("Vary", "Accept-Encoding, accept-language"), ("Vary", "X-Tenant")])
        let key = try #require(VaryKey(response: response, request: CacheFixture.fields([("Accept-Encoding", "gzip,  br")])))
        #expect(key.names == ["accept-encoding", "accept-language", "x-tenant"])
        #expect(key.matches(CacheFixture.fields([("Accept-Encoding", "GZIP, br")])))
        #expect(key.matches(CacheFixture.fields([("accept-encoding", "gzip"), ("Accept-Encoding", "br")])))
        #expect(!key.matches(CacheFixture.fields([("Accept-Encoding", "br, gzip")])))
        #expect(!key.matches(CacheFixture.fields([])))
        #expect(!key.matches(CacheFixture.fields([("Accept-Encoding", "gzip, br"), ("X-Tenant", "a")])))
        #expect(VaryKey(response: CacheFixture.fields([("Vary", "*")]), request: [:]) == nil)
        let tenant = try #require(VaryKey(response: CacheFixture.fields([("Vary", "X-Tenant")]), request: CacheFixture.fields([("X-Tenant", "A")])))
        #expect(!tenant.matches(CacheFixture.fields([("X-Tenant", "a")])))  // case kept for unknown fields
    }

    @Test("If-None-Match uses weak comparison and * ; If-Modified-Since only without it, against Last-Modified or else Date")
    func conditional() {
        let response = CacheFixture.fields([("ETag", "W/\"v1\""), ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT")])
        func notModified(_ request: [(String, String)]) -> Bool {
            ConditionalRequest.isNotModified(request: CacheFixture.fields(request), response: response)
        }
        #expect(notModified([("If-None-Match", "\"v1\"")]))
        #expect(notModified([("If-None-Match", "\"x\", W/\"v1\"")]))
        #expect(notModified([("If-None-Match", "*")]))
        #expect(!notModified([("If-None-Match", "\"v2\"")]))
        #expect(notModified([("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")]))
        #expect(!notModified([("If-Modified-Since", "Sat, 05 Nov 1994 08:49:37 GMT")]))
        #expect(!notModified([("If-None-Match", "\"v2\""), ("If-Modified-Since", "Mon, 07 Nov 1994 08:49:37 GMT")]))
        #expect(!notModified([("If-Modified-Since", "yesterday")]))
        // Without Last-Modified the response's Date stands in (RFC 9111 §4.3.2).
        let dated = CacheFixture.fields([("Date", "Sun, 06 Nov 1994 08:49:37 GMT")])
        #expect(ConditionalRequest.isNotModified(request: CacheFixture.fields([("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")]),
                                                 response: dated))
        #expect(!ConditionalRequest.isNotModified(request: CacheFixture.fields([("If-Modified-Since", "Sat, 05 Nov 1994 08:49:37 GMT")]),
                                                  response: dated))
        #expect(!ConditionalRequest.isNotModified(request: CacheFixture.fields([("If-Modified-Since", "Sun, 06 Nov 1994 08:49:37 GMT")]),
                                                  response: [:]))
    }

    @Test("If-None-Match: an entity-tag with a comma is one tag, not two (weak comparison still applies)")
    func conditionalCommaInTag() {
        func notModified(_ ifNoneMatch: String, etag: String) -> Bool {
            ConditionalRequest.isNotModified(request: CacheFixture.fields([("If-None-Match", ifNoneMatch)]),
                                             response: CacheFixture.fields([("ETag", etag)]))
        }
        // `"a,b"` is a legal opaque-tag (RFC 9110 §8.8.3): it matches itself and nothing it contains.
        #expect(notModified(#""a,b""#, etag: #""a,b""#))
        #expect(!notModified(#""a,b""#, etag: #""a""#))
        #expect(!notModified(#""a,b""#, etag: #""b""#))
        #expect(!notModified(#""a", "b""#, etag: #""a,b""#))
        #expect(notModified(#""x", "a,b""#, etag: #""a,b""#))
        // Weak comparison: a W/ prefix on either side does not matter.
        #expect(notModified(#"W/"a,b""#, etag: #""a,b""#))
        #expect(notModified(#""a,b""#, etag: #"W/"a,b""#))
        #expect(!notModified(#"W/"a,b""#, etag: #"W/"a""#))
        // A backslash is an ordinary character in an entity-tag, not an escape: `"a\"` ends there.
        #expect(notModified(#""a\", "b""#, etag: #""b""#))
        #expect(notModified(#""a\", "b""#, etag: #""a\""#))
    }

    @Test("Cache-Status values (RFC 9211)")
    func cacheStatus() {
        #expect(CacheStatus(.hit, ttl: 42).headerValue == "portico; hit; ttl=42")
        #expect(CacheStatus(.miss, forward: .uriMiss, forwardStatus: 200, ttl: 60, stored: true).headerValue
            == "portico; fwd=uri-miss; fwd-status=200; ttl=60; stored")
        #expect(CacheStatus(.stale, ttl: -5, detail: "stale-while-revalidate").headerValue
            == "portico; hit; ttl=-5; detail=stale-while-revalidate")
        #expect(CacheStatus(.collapsed, forward: .uriMiss, forwardStatus: 200, collapsed: true).headerValue
            == "portico; fwd=uri-miss; fwd-status=200; collapsed")
        #expect(CacheStatus(.revalidated, forward: .stale, forwardStatus: 304).xCacheValue == "REVALIDATED")
    }
}
