import HTTPTypes
import NIOCore
@testable import Portico
import PorticoTesting
import Testing

/// A cacheable streamed response is stored as it passes on (teed), only when it ends complete
/// within `max_object_bytes`; requests coalesced behind it get the stored copy, or go upstream.
@Suite("Cache: streamed responses", .timeLimit(.minutes(1)))
struct CacheStreamingTests {
    typealias S = MiddlewareStreamFixture

    static func cache(_ store: InMemoryCacheStore, _ configure: (inout CacheConfig) -> Void = { _ in }) -> CacheMiddleware {
        CacheMiddleware(name: "test", CacheFixture.config(configure), store: store)
    }

    static let cacheable = [("Cache-Control", "max-age=60")]

    @Test("stored when it ends complete, then served as a hit with its Content-Length; the first byte is not held back")
    func storedWhenComplete() async throws {
        let clock = ManualClock()
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let cache = Self.cache(store)
        let (streamed, writer) = S.response(headers: Self.cacheable)
        let upstream = ScriptedUpstream(streamed)
        let response = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        #expect(response.body.isStreamed)
        #expect(response.cacheStatus == "portico; fwd=uri-miss; fwd-status=200")

        let reader = response.body.reader()
        try await writer.write(S.buffer("ab"))
        #expect(try await reader.next() == S.buffer("ab"))
        #expect(store.keyCount == 0)
        try await writer.write(S.buffer("cd"))
        writer.finish()
        #expect(try await S.rest(of: reader) == Array("cd".utf8))
        #expect(store.keyCount == 1)

        let hit = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        #expect(hit.text == "abcd")
        #expect(hit.headerFields[.contentLength] == "4")
        #expect(hit.cacheStatus?.hasPrefix("portico; hit") == true)
        #expect(upstream.calls == 1)
    }

    @Test("over max_object_bytes: copying stops and nothing is stored, yet the client gets every byte")
    func overTheLimit() async throws {
        let clock = ManualClock()
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let cache = Self.cache(store) { $0.maxObjectBytes = 4 }
        let (streamed, writer) = S.response(headers: Self.cacheable)
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? streamed : CacheFixture.response(headers: Self.cacheable, body: "ok")
        }
        let response = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        let reader = response.body.reader()
        try await writer.write(S.buffer("abc"))
        try await writer.write(S.buffer("def"))
        writer.finish()
        #expect(try await S.rest(of: reader) == Array("abcdef".utf8))
        #expect(store.keyCount == 0)
        _ = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        #expect(upstream.calls == 2)
    }

    @Test("a declared length over max_object_bytes is not copied at all")
    func declaredTooLarge() async throws {
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let cache = Self.cache(store) { $0.maxObjectBytes = 4 }
        let (streamed, _) = S.response(headers: Self.cacheable, length: 100_000)
        let response = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(ManualClock()),
                                              next: ScriptedUpstream(streamed).next)
        #expect(response.body.stages.isEmpty)
    }

    @Test("a truncated body is never stored: the upstream reset, or the client left")
    func truncatedNeverStored() async throws {
        let clock = ManualClock()
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let cache = Self.cache(store)

        let (reset, resetWriter) = S.response(headers: Self.cacheable)
        let first = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock),
                                           next: ScriptedUpstream(reset).next)
        let firstReader = first.body.reader()
        try await resetWriter.write(S.buffer("ab"))
        #expect(try await firstReader.next() == S.buffer("ab"))
        resetWriter.fail(GatewayError(.upstreamConnectionClosed, message: "reset"))
        await #expect(throws: GatewayError.self) { try await firstReader.next() }
        #expect(store.keyCount == 0)

        let (left, leftWriter) = S.response(headers: Self.cacheable)
        let second = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock),
                                            next: ScriptedUpstream(left).next)
        let secondReader = second.body.reader()
        try await leftWriter.write(S.buffer("ab"))
        #expect(try await secondReader.next() == S.buffer("ab"))
        secondReader.close(.clientClosedRequest())
        #expect(leftWriter.readerGone != nil)
        #expect(store.keyCount == 0)
    }

    @Test("requests coalesced behind a streamed miss get the stored copy when it completes")
    func waitersGetTheStoredCopy() async throws {
        let clock = ManualClock()
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let cache = Self.cache(store)
        let (streamed, writer) = S.response(headers: Self.cacheable)
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? streamed : CacheFixture.response(headers: Self.cacheable, body: "second fetch")
        }
        let leader = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        let follower = Task {
            try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        }
        try await Eventually.wait("the follower waits") { cache.waitingRequests == 1 }
        let reader = leader.body.reader()
        try await writer.write(S.buffer("abcd"))
        writer.finish()
        #expect(try await S.rest(of: reader) == Array("abcd".utf8))
        let followed = try await follower.value
        #expect(followed.text == "abcd")
        #expect(followed.cacheStatus?.contains("collapsed") == true)
        #expect(upstream.calls == 1)
    }

    @Test("waiters go upstream themselves as soon as the streamed miss cannot be stored: over the limit, or failed")
    func waitersGoUpstream() async throws {
        for failing in [false, true] {
            let clock = ManualClock()
            let store = InMemoryCacheStore(maxBytes: 1 << 20)
            let cache = Self.cache(store) { $0.maxObjectBytes = 4 }
            let (streamed, writer) = S.response(headers: Self.cacheable)
            let upstream = ScriptedUpstream { n, _ in
                n == 1 ? streamed : CacheFixture.response(headers: Self.cacheable, body: "own")
            }
            let leader = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
            let follower = Task {
                try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
            }
            try await Eventually.wait("the follower waits") { cache.waitingRequests == 1 }
            let reader = leader.body.reader()
            if failing {
                writer.fail(GatewayError(.upstreamConnectionClosed, message: "reset"))
                await #expect(throws: GatewayError.self) { try await reader.next() }
            } else {
                try await writer.write(S.buffer("abcdef"))
                #expect(try await reader.next() == S.buffer("abcdef"))
            }
            // The leader's stream is still open (or failed): the follower did not wait for its end.
            let followed = try await follower.value
            #expect(followed.text == "own", "failing: \(failing)")
            #expect(upstream.calls == 2)
            if !failing {
                writer.finish()
                #expect(try await reader.next() == nil)
            }
        }
    }

    @Test("a streamed miss whose body is dropped unread releases its waiters: they go upstream")
    func droppedUnreadReleasesWaiters() async throws {
        let clock = ManualClock()
        let cache = Self.cache(InMemoryCacheStore(maxBytes: 1 << 20))
        let (streamed, _) = S.response(headers: Self.cacheable)
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? streamed : CacheFixture.response(headers: Self.cacheable, body: "own")
        }
        var leader: GatewayResponse? = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock),
                                                               next: upstream.next)
        #expect(leader?.body.isStreamed == true)
        let follower = Task {
            try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        }
        try await Eventually.wait("the follower waits") { cache.waitingRequests == 1 }
        leader = nil
        #expect(try await follower.value.text == "own")
        #expect(upstream.calls == 2)
    }

    @Test("a streamed 200 to a revalidation is teed: the new response replaces the stale one when complete")
    func revalidationTeed() async throws {
        let clock = ManualClock()
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let cache = Self.cache(store)
        let (streamed, writer) = S.response(headers: [("Cache-Control", "max-age=60"), ("ETag", "\"v2\"")])
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? CacheFixture.response(headers: [("Cache-Control", "max-age=1"), ("ETag", "\"v1\"")], body: "old") : streamed
        }
        _ = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        clock.advance(by: .seconds(5))
        let modified = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        #expect(upstream.requests.last?.headerFields[.ifNoneMatch] == "\"v1\"")
        let reader = modified.body.reader()
        try await writer.write(S.buffer("new!"))
        writer.finish()
        #expect(try await S.rest(of: reader) == Array("new!".utf8))
        let hit = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        #expect(hit.text == "new!")
        #expect(hit.headerFields[.eTag] == "\"v2\"")
        #expect(upstream.calls == 2)
    }

    @Test("a background refresh (stale-while-revalidate) reads a streamed response itself and stores it")
    func backgroundRefreshStoresStream() async throws {
        let clock = ManualClock()
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let cache = Self.cache(store)
        let (streamed, writer) = S.response(headers: Self.cacheable)
        let upstream = ScriptedUpstream { n, _ in
            n == 1 ? CacheFixture.response(headers: [("Cache-Control", "max-age=1, stale-while-revalidate=100")], body: "old")
                : streamed
        }
        _ = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        clock.advance(by: .seconds(5))
        let stale = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        #expect(stale.text == "old")
        try await Eventually.wait("the refresh asks the upstream") { upstream.calls == 2 }
        try await writer.write(S.buffer("fresh"))
        writer.finish()
        try await Eventually.wait("the refresh ends") { cache.backgroundRefreshes == 0 }
        let hit = try await cache.handle(CacheFixture.request(), context: CacheFixture.context(clock), next: upstream.next)
        #expect(hit.text == "fresh")
        #expect(upstream.calls == 2)
    }

    @Test("a client whose validators match a streamed 200 gets a 304; the body is cancelled, not stored")
    func conditionalClientGets304() async throws {
        let store = InMemoryCacheStore(maxBytes: 1 << 20)
        let cache = Self.cache(store)
        let (streamed, writer) = S.response(headers: [("Cache-Control", "max-age=60"), ("ETag", "\"v\"")])
        let response = try await cache.handle(CacheFixture.request(headers: [("If-None-Match", "\"v\"")]),
                                              context: CacheFixture.context(ManualClock()), next: ScriptedUpstream(streamed).next)
        #expect(response.status == .notModified)
        #expect(writer.readerGone != nil)
        #expect(store.keyCount == 0)
    }
}
