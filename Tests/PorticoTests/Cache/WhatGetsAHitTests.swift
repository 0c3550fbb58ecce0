import Foundation
import HTTPTypes
import Portico
import PorticoTesting
import Testing

/// The caching page (docs/caching.md) opens with a "what gets a hit" table; its rows hold.
@Suite("Cache: what gets a hit (docs/caching.md)")
struct WhatGetsAHitTests {
    let clock = ManualClock()

    func send(_ cache: CacheMiddleware, _ upstream: ScriptedUpstream) async throws -> (GatewayResponse, String?) {
        let context = CacheFixture.context(clock)
        let response = try await cache.handle(CacheFixture.request(), context: context, next: upstream.next)
        return (response, context.stats.snapshot.cacheStatus)
    }

    /// A plain static file server: `Last-Modified` (ten days old) and `Date`, no lifetime.
    func staticFileServer() -> ScriptedUpstream {
        let date = CacheFixture.httpDate(clock.wallNow)
        let lastModified = CacheFixture.httpDate(clock.wallNow.addingTimeInterval(-10 * 86_400))
        return ScriptedUpstream { n, _ in
            n == 1 ? CacheFixture.response(headers: [("Date", date), ("Last-Modified", lastModified)])
                : CacheFixture.response(304, headers: [("Date", date), ("Last-Modified", lastModified)], body: "")
        }
    }

    @Test("the caching page opens with the table, naming the plain upstream and heuristic_fraction")
    func readme() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
        let page = try String(contentsOf: root.appendingPathComponent("docs/caching.md"), encoding: .utf8)
        let section = try #require(page.components(separatedBy: "# Caching\n").dropFirst().first)
        let opening = section.split(separator: "\n", omittingEmptySubsequences: true).prefix(6).map(String.init)
        #expect(opening.first?.hasPrefix("What gets a hit") == true)
        let rows = opening.filter { $0.hasPrefix("| ") && !$0.hasPrefix("| the upstream") }
        #expect(rows.count == 3)
        #expect(rows.contains { $0.contains("python3 -m http.server") && $0.contains("heuristic_fraction") && $0.contains("REVALIDATED") })
    }

    @Test("only Last-Modified: stored, then revalidated on every request, never a hit")
    func validatorOnly() async throws {
        let cache = CacheMiddleware(name: "test", CacheFixture.config())
        let upstream = staticFileServer()
        let (first, _) = try await send(cache, upstream)
        #expect(first.cacheStatus?.contains("stored") == true)
        for _ in 0..<2 {
            let (again, log) = try await send(cache, upstream)
            #expect(again.cacheStatus?.hasPrefix("portico; fwd=stale; fwd-status=304") == true)
            #expect(log == "revalidated")
        }
        #expect(upstream.calls == 3)
    }

    @Test("only Last-Modified with heuristic_fraction: a hit")
    func heuristic() async throws {
        let cache = CacheMiddleware(name: "test", CacheFixture.config { $0.heuristicFraction = 0.1 })
        let upstream = staticFileServer()
        _ = try await send(cache, upstream)
        clock.advance(by: .seconds(60))
        let (second, log) = try await send(cache, upstream)
        #expect(second.cacheStatus?.hasPrefix("portico; hit") == true)
        #expect(log == "hit")
        #expect(upstream.calls == 1)
    }

    @Test("max-age: a hit; no-store: never stored")
    func lifetimeAndNoStore() async throws {
        let cache = CacheMiddleware(name: "test", CacheFixture.config())
        let fresh = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "max-age=60")]))
        _ = try await send(cache, fresh)
        #expect(try await send(cache, fresh).1 == "hit")
        let noStore = CacheMiddleware(name: "test2", CacheFixture.config())
        let upstream = ScriptedUpstream(CacheFixture.response(headers: [("Cache-Control", "no-store")]))
        _ = try await send(noStore, upstream)
        let (second, log) = try await send(noStore, upstream)
        #expect(second.cacheStatus?.hasPrefix("portico; fwd=uri-miss") == true)
        #expect(log == "miss")
        #expect(upstream.calls == 2)
    }
}
