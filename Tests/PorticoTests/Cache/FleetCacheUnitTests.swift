import Foundation
import HTTPTypes
import NIOCore
@testable import Portico
import PorticoTesting
import RedisClient
import Testing

/// The pieces of the fleet tier that need no Redis: the record format, purge requests and
/// matching, the memory tier's purge, and reading the invalidation stream.
@Suite("Fleet cache tier: records, purges, events")
struct FleetCacheUnitTests {
    @Test("a record read back is the same response, older by the time it spent in the store")
    func roundTrip() throws {
        let clock = ManualClock()
        let entry = CacheFixture.entry([
            ("Cache-Control", "max-age=60, stale-while-revalidate=30, no-cache=\"Set-Cookie\""), ("Vary", "Accept-Language"),
            ("ETag", "\"v1\""), ("Surrogate-Key", "a b"),
        ], request: [("Accept-Language", "de")], clock: clock, body: "hello fleet")
        clock.advance(by: .seconds(5))
        let record = CacheEntryCodec.encode(entry, age: entry.age(at: clock.now), wallNow: clock.wallNow)

        // Read 7 s later on another replica (its own monotonic clock): 12 s old.
        let reader = ManualClock()
        reader.advance(by: .seconds(1000))
        let wallRead = clock.wallNow.addingTimeInterval(7)
        let decoded = CacheEntryCodec.decode(record, key: entry.key, now: reader.now, wallNow: wallRead)
        let read = try #require(decoded)
        #expect(read.key == entry.key && read.status == entry.status && read.vary == entry.vary)
        let readFields: [HTTPField] = Array(read.headerFields)
        let storedFields: [HTTPField] = Array(entry.headerFields)
        #expect(readFields == storedFields)
        #expect(read.body == entry.body)
        #expect(read.age(at: reader.now) == Duration.seconds(12))
        #expect(read.receivedAt == reader.now)
        var expected = entry.freshness
        expected.initialAge = .seconds(12)
        #expect(read.freshness == expected)
        #expect(read.storedWithAuthorization == entry.storedWithAuthorization)
    }

    @Test("a record from another version, or cut short, is no entry (a miss), never a crash")
    func unreadable() throws {
        let clock = ManualClock()
        let entry = CacheFixture.entry([("Cache-Control", "max-age=60")], clock: clock)
        let record = CacheEntryCodec.encode(entry, age: .zero, wallNow: clock.wallNow)
        var otherVersion = record
        otherVersion[0] = 99
        #expect(CacheEntryCodec.decode(otherVersion, key: entry.key, now: clock.now, wallNow: clock.wallNow) == nil)
        for length in [0, 1, 9, record.count / 2, record.count - 1] {
            #expect(CacheEntryCodec.decode(Array(record.prefix(length)), key: entry.key, now: clock.now, wallNow: clock.wallNow) == nil)
        }
        #expect(CacheEntryCodec.decode(record + [0], key: entry.key, now: clock.now, wallNow: clock.wallNow) == nil)
        #expect(CacheEntryCodec.decode(Array("not a record".utf8), key: entry.key, now: clock.now, wallNow: clock.wallNow) == nil)
    }

    @Test("purge bodies: url, prefix (with host), tag; scope and cache; each mistake named")
    func purgeBodies() throws {
        func parse(_ json: String) throws(CachePurgeTarget.RequestError) -> (CachePurgeTarget, scope: CachePurgeTarget.Scope?, cache: String?) {
            try CachePurgeTarget.parse(Array(json.utf8))
        }
        let url = try parse(#"{"url": "http://API.example:8080/v1/items?page=2"}"#)
        #expect(url.0 == .key(CacheMiddleware.key(authority: "API.example:8080", target: "/v1/items?page=2")))
        #expect(url.scope == nil && url.cache == nil)
        #expect(try parse(#"{"url": "https://api.example"}"#).0 == .key("api.example\u{0}/"))
        let prefix = try parse(#"{"prefix": "/v1/", "host": "Api.Example", "scope": "local", "cache": "c"}"#)
        #expect(prefix.0 == .prefix("/v1/", authority: "api.example") && prefix.scope == .local && prefix.cache == "c")
        #expect(try parse(#"{"tag": " group-a ", "scope": "fleet"}"#) == (.tag("group-a"), .fleet, nil))

        let mistakes: [(String, CachePurgeTarget.RequestError)] = [
            ("not json", .notJSON), ("[1]", .notJSON), (#"{"scope": "everywhere", "tag": "a"}"#, .notJSON),
            ("{}", .noTarget), (#"{"url": "http://a/", "tag": "t"}"#, .severalTargets),
            (#"{"url": "/relative"}"#, .badURL("/relative")), (#"{"url": "ftp://a/"}"#, .badURL("ftp://a/")),
            (#"{"prefix": "v1"}"#, .badPrefix), (#"{"tag": "t", "host": "a"}"#, .hostWithoutPrefix), (#"{"tag": "  "}"#, .emptyTag),
        ]
        for (body, expected) in mistakes {
            #expect(throws: expected, "\(body)") { try parse(body) }
        }
        #expect(CachePurgeTarget.RequestError.noTarget.description.contains("\"url\", \"prefix\" or \"tag\""))
    }

    @Test("tags come from Surrogate-Key (spaces) and Cache-Tag (commas), bounded")
    func tags() {
        var fields = HTTPFields()
        fields.append(HTTPField(name: CachePurgeTarget.surrogateKey, value: "a  b a"))
        fields.append(HTTPField(name: CachePurgeTarget.cacheTag, value: "c, d,,b"))
        #expect(CachePurgeTarget.tags(of: fields) == ["a", "b", "c", "d"])
        var many = HTTPFields()
        many[CachePurgeTarget.surrogateKey] = (0..<100).map { "t\($0)" }.joined(separator: " ") + " " + String(repeating: "x", count: 300)
        #expect(CachePurgeTarget.tags(of: many).count == CachePurgeTarget.maxTags)
    }

    @Test("the memory tier purges by key, prefix (on one authority or all) and tag, and can empty itself")
    func memoryPurge() {
        let clock = ManualClock()
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        func put(_ authority: String, _ target: String, tags: String? = nil) {
            var headers = [("Cache-Control", "max-age=60")]
            if let tags { headers.append(("Cache-Tag", tags)) }
            store.insert(CacheFixture.entry(headers, clock: clock, key: CacheMiddleware.key(authority: authority, target: target)))
        }
        put("a.test", "/v1/x", tags: "red")
        put("a.test", "/v1/y", tags: "blue, red")
        put("b.test", "/v1/x")
        put("a.test", "/v2/x", tags: "blue")
        #expect(store.removeAll(matching: .prefix("/v1/", authority: "A.test")).removed == 2)
        #expect(store.keyCount == 2)
        #expect(store.removeAll(matching: .tag("blue")).removed == 1)
        #expect(store.removeAll(matching: .tag("blue")).removed == 0)
        #expect(store.removeAll(matching: .key(CacheMiddleware.key(authority: "b.test", target: "/v1/x"))).removed == 1)
        #expect(store.keyCount == 0 && store.storedBytes == 0)
        put("a.test", "/1")
        put("b.test", "/2")
        let (removed, change) = store.removeEverything()
        #expect(removed == 2 && change.changed && store.keyCount == 0)
        #expect(!store.removeEverything().change.changed)
        #expect(store.variants(for: CacheMiddleware.key(authority: "a.test", target: "/1")).isEmpty)
    }

    @Test("the invalidation stream's entries read as events; malformed ones are skipped")
    func events() {
        func entry(_ id: String, _ fields: [String]) -> RESPValue {
            .array([.bulkString(Array(id.utf8)), .array(fields.map { .bulkString(Array($0.utf8)) })])
        }
        let reply = RESPValue.array([
            entry("1-0", ["seq", "1", "origin", "r1", "kind", "key", "value", "a\u{0}/x", "authority", ""]),
            entry("2-0", ["seq", "2", "origin", "r2", "kind", "prefix", "value", "/v1/", "authority", "a.test"]),
            entry("3-0", ["seq", "3", "origin", "r2", "kind", "tag", "value", "red", "authority", ""]),
            entry("4-0", ["seq", "4", "origin", "r2", "kind", "future", "value", "x"]),
            entry("5-0", ["origin", "r2"]),
            .integer(3),
        ])
        #expect(CacheInvalidationFeed.events(in: reply) == [
            .init(id: "1-0", sequence: 1, origin: "r1", target: .key("a\u{0}/x")),
            .init(id: "2-0", sequence: 2, origin: "r2", target: .prefix("/v1/", authority: "a.test")),
            .init(id: "3-0", sequence: 3, origin: "r2", target: .tag("red")),
            .init(id: "4-0", sequence: 4, origin: "r2", target: nil),
        ])
        #expect(CacheInvalidationFeed.events(in: .null).isEmpty)
    }
}
