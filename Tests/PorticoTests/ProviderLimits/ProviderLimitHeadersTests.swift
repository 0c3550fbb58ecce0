import Foundation
import HTTPTypes
import Portico
import Testing

@Suite("Provider limits: reading what a provider says of its limit")
struct ProviderLimitHeadersTests {
    let now = Date(timeIntervalSince1970: 1_750_000_000)

    func fields(_ pairs: [(String, String)]) -> HTTPFields {
        var fields = HTTPFields()
        for (name, value) in pairs { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        return fields
    }

    @Test("RateLimit and RateLimit-Policy as structured-field lists (draft -08 and later): the tightest policy counts")
    func structured() {
        let seen = ProviderLimitHeaders.observe(fields([
            ("RateLimit", "\"hour\";r=900;t=1800, \"second\";r=3;t=1"),
            ("RateLimit-Policy", "\"hour\";q=1000;w=3600, \"second\";q=10;w=1"),
        ]), status: 200, now: now)
        #expect(seen.remaining == 3)
        #expect(seen.reset == .seconds(1))
        #expect(seen.limit == 10)
        #expect(seen.window == .seconds(1))
        #expect(seen.malformed.isEmpty)
    }

    @Test("RateLimit as a dictionary (earlier drafts) and the separate RateLimit-Limit/-Remaining/-Reset")
    func olderDrafts() {
        let dictionary = ProviderLimitHeaders.observe(fields([("RateLimit", "limit=100, remaining=50, reset=5")]), status: 200, now: now)
        #expect(dictionary.limit == 100)
        #expect(dictionary.remaining == 50)
        #expect(dictionary.reset == .seconds(5))
        let separate = ProviderLimitHeaders.observe(fields([
            ("RateLimit-Limit", "60"), ("RateLimit-Remaining", "7"), ("RateLimit-Reset", "12"),
        ]), status: 200, now: now)
        #expect(separate.limit == 60)
        #expect(separate.remaining == 7)
        #expect(separate.reset == .seconds(12))
    }

    @Test("X-RateLimit-Reset as seconds from now, as a Unix time, and in milliseconds")
    func xRateLimit() {
        let delta = ProviderLimitHeaders.observe(fields([("X-RateLimit-Remaining", "4"), ("X-RateLimit-Reset", "30")]),
                                                 status: 200, now: now)
        #expect(delta.remaining == 4)
        #expect(delta.reset == .seconds(30))
        let unix = ProviderLimitHeaders.observe(fields([("X-RateLimit-Limit", "5000"), ("X-RateLimit-Remaining", "4999"),
                                                        ("X-RateLimit-Reset", "1750000042")]), status: 200, now: now)
        #expect(unix.limit == 5000)
        #expect(unix.reset == .seconds(42))
        let millis = ProviderLimitHeaders.observe(fields([("X-RateLimit-Remaining", "1"), ("X-RateLimit-Reset", "1750000002500")]),
                                                  status: 200, now: now)
        #expect(millis.reset == .milliseconds(2500))
    }

    @Test("a Unix reset is read against the response's Date: a provider 30 s off costs nothing")
    func skewedProvider() {
        // The provider's clock is 30 s ahead of ours; its window ends 10 s after its own now.
        let providerNow = now.addingTimeInterval(30)
        let seen = ProviderLimitHeaders.observe(fields([
            ("Date", HTTPDate.format(providerNow)),
            ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", String(Int(providerNow.timeIntervalSince1970) + 10)),
        ]), status: 200, now: now)
        #expect(seen.reset == .seconds(10))
    }

    @Test("a Unix reset from a provider whose Date reads this gateway's second is read against this gateway's clock, to the millisecond")
    func unixResetWithSyncedClocks() {
        // 700 ms into the provider's second; its window ends on the next second.
        let ours = now.addingTimeInterval(0.7)
        let seen = ProviderLimitHeaders.observe(fields([
            ("Date", HTTPDate.format(now)), ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", String(Int(now.timeIntervalSince1970) + 1)),
        ]), status: 200, now: ours)
        #expect(seen.reset == .milliseconds(300))
        // A Date a second or more away from our clock is the provider's now, whole seconds.
        let skewed = ProviderLimitHeaders.observe(fields([
            ("Date", HTTPDate.format(now.addingTimeInterval(-2))), ("X-RateLimit-Remaining", "0"),
            ("X-RateLimit-Reset", String(Int(now.timeIntervalSince1970) + 1)),
        ]), status: 200, now: ours)
        #expect(skewed.reset == .seconds(3))
    }

    @Test("Retry-After on 429 and 503, as seconds or an HTTP-date (against Date); ignored on a 200")
    func retryAfter() {
        let seconds = ProviderLimitHeaders.observe(fields([("Retry-After", "3")]), status: 429, now: now)
        #expect(seconds.retryAfter == .seconds(3))
        let providerNow = now.addingTimeInterval(-30)
        let date = ProviderLimitHeaders.observe(fields([
            ("Date", HTTPDate.format(providerNow)), ("Retry-After", HTTPDate.format(providerNow.addingTimeInterval(8))),
        ]), status: 503, now: now)
        #expect(date.retryAfter == .seconds(8))
        #expect(ProviderLimitHeaders.observe(fields([("Retry-After", "3")]), status: 200, now: now).retryAfter == nil)
    }

    @Test("malformed values are ignored and named, never an error")
    func malformed() {
        let seen = ProviderLimitHeaders.observe(fields([
            ("RateLimit", "%%%"), ("X-RateLimit-Remaining", "-4"), ("X-RateLimit-Reset", "soon"), ("Retry-After", "later"),
            ("X-RateLimit-Limit", "100"),
        ]), status: 429, now: now)
        #expect(seen.remaining == nil)
        #expect(seen.reset == nil)
        #expect(seen.retryAfter == nil)
        #expect(seen.limit == 100)
        #expect(Set(seen.malformed) == ["ratelimit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after"])
    }
}
