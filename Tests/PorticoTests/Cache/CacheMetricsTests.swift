import CoreMetrics
import HTTPTypes
import Portico
import PorticoTesting
import Synchronization
import Testing

/// A metrics backend that keeps every counter and gauge value in memory.
final class RecordingMetrics: MetricsFactory, Sendable {
    final class Handle: CounterHandler, RecorderHandler, TimerHandler, Sendable {
        private let value = Mutex<Int64>(0)
        var current: Int64 { value.withLock { $0 } }
        func increment(by amount: Int64) { value.withLock { $0 += amount } }
        func reset() { value.withLock { $0 = 0 } }
        func record(_ value: Int64) { self.value.withLock { $0 = value } }
        func record(_ value: Double) { self.value.withLock { $0 = Int64(value) } }
        func recordNanoseconds(_ duration: Int64) {}
    }

    private let handles = Mutex<[String: Handle]>([:])

    static func key(_ label: String, _ dimensions: [(String, String)]) -> String {
        ([label] + dimensions.map { "\($0.0)=\($0.1)" }).joined(separator: " ")
    }

    private func handle(_ label: String, _ dimensions: [(String, String)]) -> Handle {
        handles.withLock { handles in
            let key = Self.key(label, dimensions)
            if let existing = handles[key] { return existing }
            let created = Handle()
            handles[key] = created
            return created
        }
    }

    /// The value of a series, 0 when never touched.
    func value(_ label: String, _ dimensions: [(String, String)] = [("cache", "test")]) -> Int64 {
        handles.withLock { $0[Self.key(label, dimensions)]?.current ?? 0 }
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler { handle(label, dimensions) }
    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler { handle(label, dimensions) }
    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler { handle(label, dimensions) }
    func destroyCounter(_ handler: any CounterHandler) {}
    func destroyRecorder(_ handler: any RecorderHandler) {}
    func destroyTimer(_ handler: any TimerHandler) {}
}

@Suite("Cache metrics")
struct CacheMetricsTests {
    @Test("hits, misses, revalidations, stale answers, stored bytes and evictions are counted")
    func counted() async throws {
        let clock = ManualClock()
        let metrics = RecordingMetrics()
        let store = InMemoryCacheStore(maxBytes: 2000)
        let cache = CacheMiddleware(name: "test", CacheConfig(), store: store,
                                    metrics: CacheMetrics(cache: "test", factory: metrics))
        let upstream = ScriptedUpstream { n, request in
            if request.target == "/down" && n > 4 { throw UpstreamError.connectFailed("refused").gatewayError(upstream: "items") }
            if n == 3 { return CacheFixture.response(304, headers: [("ETag", "\"a\"")], body: "") }
            return CacheFixture.response(headers: [("Cache-Control", "max-age=10, stale-if-error=100"), ("ETag", "\"a\"")],
                                         body: String(repeating: "x", count: 800))
        }
        func get(_ target: String) async throws {
            _ = try await cache.handle(CacheFixture.request(.get, target), context: CacheFixture.context(clock), next: upstream.next)
        }
        try await get("/a")                 // miss (call 1)
        try await get("/a")                 // hit
        #expect(metrics.value("portico_cache_misses_total") == 1)
        #expect(metrics.value("portico_cache_hits_total") == 1)
        #expect(metrics.value("portico_cache_stored_bytes") == Int64(store.storedBytes) && store.storedBytes > 800)
        clock.advance(by: .seconds(20))
        try await get("/b")                 // miss (call 2); /a and /b do not both fit: /a is evicted
        #expect(metrics.value("portico_cache_evictions_total") == 1)
        try await get("/a")                 // miss again (call 3 answers 304, but there is nothing to validate)
        #expect(metrics.value("portico_cache_misses_total") == 3)
        try await get("/down")              // call 4: stored
        clock.advance(by: .seconds(20))
        try await get("/down")              // call 5 fails: validation failed, stale served
        #expect(metrics.value("portico_cache_revalidations_total", [("cache", "test"), ("result", "failed")]) == 1)
        #expect(metrics.value("portico_cache_stale_served_total", [("cache", "test"), ("reason", "stale_if_error")]) == 1)
    }
}
