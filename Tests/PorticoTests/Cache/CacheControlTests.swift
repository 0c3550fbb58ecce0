import Foundation
import HTTPTypes
import Portico
import Testing

@Suite("Cache-Control parsing (RFC 9111 §5.2)")
struct CacheControlTests {
    @Test("directive names are case-insensitive and arguments may be quoted")
    func caseAndQuotes() {
        let cc = CacheControl(parsing: #"Max-Age="60", PUBLIC, s-maxage=120"#)
        #expect(cc.seconds("max-age") == .value(60))
        #expect(cc.contains("public"))
        #expect(cc.seconds("s-maxage") == .value(120))
    }

    @Test("quoted strings keep commas and escapes; field-name lists are split and lower-cased")
    func fieldLists() {
        let cc = CacheControl(parsing: #"no-cache="Set-Cookie, X-Token", private="X-User", max-age=5"#)
        #expect(cc.fieldNames("no-cache") == ["set-cookie", "x-token"])
        #expect(cc.fieldNames("private") == ["x-user"])
        #expect(cc.seconds("max-age") == .value(5))
        #expect(CacheControl(parsing: "no-cache").fieldNames("no-cache") == [])
        #expect(CacheControl(parsing: "max-age=1").fieldNames("no-cache") == nil)
        #expect(CacheControl(parsing: #"x="a\"b", max-age=3"#).directives.first?.argument == #"a"b"#)
    }

    @Test("several field lines are one list")
    func severalLines() {
        var fields = HTTPFields()
        fields.append(HTTPField(name: .cacheControl, value: "public"))
        fields.append(HTTPField(name: .cacheControl, value: "max-age=30"))
        let cc = CacheControl(fields)
        #expect(cc.contains("public") && cc.seconds("max-age") == .value(30))
    }

    @Test("malformed delta-seconds are invalid, conflicting duplicates too, equal ones are fine", arguments: [
        ("max-age=abc", CacheControl.Seconds.invalid),
        ("max-age=-1", .invalid),
        ("max-age=1.5", .invalid),
        ("max-age", .invalid),
        ("max-age=", .invalid),
        ("max-age=10, max-age=20", .invalid),
        ("max-age=10, max-age=10", .value(10)),
        ("max-age = 7", .value(7)),
        ("max-age=99999999999999999999", .value(CacheControl.maxDeltaSeconds)),
        ("public", .absent),
    ])
    func deltaSeconds(value: String, expected: CacheControl.Seconds) {
        #expect(CacheControl(parsing: value).seconds("max-age") == expected)
    }

    @Test("garbage between directives is skipped, not fatal")
    func garbage() {
        let cc = CacheControl(parsing: ",, max-age=5 junk junk, , no-store,")
        #expect(cc.seconds("max-age") == .value(5))
        #expect(cc.contains("no-store"))
        #expect(CacheControl(parsing: #"no-cache="unterminated"#).fieldNames("no-cache") == ["unterminated"])
    }

    @Test("bare max-stale means any staleness")
    func bareMaxStale() {
        #expect(CacheControl(parsing: "max-stale").secondsAllowingBare("max-stale") == .value(CacheControl.maxDeltaSeconds))
        #expect(CacheControl(parsing: "max-stale=10").secondsAllowingBare("max-stale") == .value(10))
    }

    @Test("request directives, Pragma only without Cache-Control")
    func requestDirectives() {
        let pragma = RequestDirectives(CacheFixture.fields([("Pragma", "no-cache")]))
        #expect(pragma.noCache)
        let both = RequestDirectives(CacheFixture.fields([("Pragma", "no-cache"), ("Cache-Control", "max-age=60")]))
        #expect(!both.noCache && both.maxAge == .seconds(60))
        let all = RequestDirectives(CacheFixture.fields([
            ("Cache-Control", "no-store, max-stale, min-fresh=5, only-if-cached"), ("Authorization", "Bearer x"),
        ]))
        #expect(all.noStore && all.onlyIfCached && all.hasAuthorization)
        #expect(all.maxStale == .seconds(CacheControl.maxDeltaSeconds) && all.minFresh == .seconds(5))
        // A malformed limit is read strictly: max-age=0.
        #expect(RequestDirectives(CacheFixture.fields([("Cache-Control", "max-age=soon")])).maxAge == .zero)
    }

    @Test("HTTP dates format as IMF-fixdate and parse back")
    func httpDates() {
        #expect(HTTPDate.format(Date(timeIntervalSince1970: 784_111_777)) == "Sun, 06 Nov 1994 08:49:37 GMT")
        #expect(HTTPDate.format(Date(timeIntervalSince1970: 0)) == "Thu, 01 Jan 1970 00:00:00 GMT")
        let date = Date(timeIntervalSince1970: 1_750_000_000)
        #expect(HTTPDate.parse(HTTPDate.format(date)) == date)
        #expect(HTTPDate.format(Date(timeIntervalSince1970: 951_782_400)) == "Tue, 29 Feb 2000 00:00:00 GMT")
    }
}
