import CoreMetrics
import Foundation
import LockAudit
import Metrics
@testable import Portico
import Prometheus
import Synchronization
import Testing

/// Per-thread metrics (issue #33): what many threads record merges exactly when read, and reads
/// as swift-prometheus would have rendered it.
// Serialized: one test fills every shard on purpose, which would send another test's threads
// to the shared path.
@Suite("Sharded metrics", .serialized, .timeLimit(.minutes(1)))
struct ShardedMetricsTests {
    /// Runs `body(thread)` on `count` threads of their own, all alive at once, and waits for them.
    /// Each thread first runs `warmUp` (taking its shard), then waits until every thread has.
    static func onThreads(_ count: Int, warmUp: @escaping @Sendable (Int) -> Void = { _ in },
                          _ body: @escaping @Sendable (Int) -> Void) {
        let ready = DispatchSemaphore(value: 0), go = DispatchSemaphore(value: 0), done = DispatchSemaphore(value: 0)
        for index in 0..<count {
            let thread = Thread {
                warmUp(index)
                ready.signal()
                go.wait()
                body(index)
                done.signal()
            }
            thread.stackSize = 256 * 1024
            thread.start()
        }
        for _ in 0..<count { ready.wait() }
        for _ in 0..<count { go.signal() }
        for _ in 0..<count { done.wait() }
    }

    static func prometheus(_ registry: PrometheusCollectorRegistry) -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = GatewayMetrics.requestDurationBuckets
        factory.durationHistogramBuckets = ["custom_seconds": [.milliseconds(1), .milliseconds(100), .seconds(2)]]
        factory.valueHistogramBuckets = ["payload_bytes": [0, 1.5, 64, 1024]]
        return factory
    }

    static func sharded(_ registry: PrometheusCollectorRegistry) -> ShardedMetricsFactory {
        let prometheus = prometheus(registry)
        return ShardedMetricsFactory(base: prometheus, buckets: .init(
            defaultDuration: prometheus.defaultDurationHistogramBuckets, duration: prometheus.durationHistogramBuckets,
            defaultValue: prometheus.defaultValueHistogramBuckets, value: prometheus.valueHistogramBuckets))
    }

    static func text(_ factory: ShardedMetricsFactory, _ registry: PrometheusCollectorRegistry) -> String {
        String(decoding: factory.exposition { registry.emitToBuffer() }, as: UTF8.self)
    }

    static func value(_ text: String, _ name: String, _ labels: [String: String] = [:]) -> Double? {
        PrometheusText.parse(Array(text.utf8)).first { $0.name == name && $0.labels == labels }?.value
    }

    @Test("counters and meters written by 8 threads × 10 000 merge exactly, flush after flush")
    func countsMerge() {
        let registry = PrometheusCollectorRegistry()
        let factory = Self.sharded(registry)
        let requests = Counter(label: "requests_total", dimensions: [("route", "a")], factory: factory)
        let bytes = Counter(label: "bytes_total", factory: factory)
        let inFlight = Meter(label: "in_flight", factory: factory)
        Self.onThreads(8) { thread in
            for _ in 0..<10_000 {
                inFlight.increment()
                requests.increment()
                bytes.increment(by: 3)
                if thread % 2 == 0 { inFlight.decrement() }
            }
        }
        let first = Self.text(factory, registry)
        #expect(Self.value(first, "requests_total", ["route": "a"]) == 80_000)
        #expect(Self.value(first, "bytes_total") == 240_000)
        #expect(Self.value(first, "in_flight") == 40_000)

        // A second read adds only what came since.
        Self.onThreads(4) { _ in
            for _ in 0..<1_000 { requests.increment(); inFlight.decrement() }
        }
        let second = Self.text(factory, registry)
        #expect(Self.value(second, "requests_total", ["route": "a"]) == 84_000)
        #expect(Self.value(second, "in_flight") == 36_000)
        // Nothing new: nothing added.
        #expect(Self.value(Self.text(factory, registry), "requests_total", ["route": "a"]) == 84_000)

        inFlight.set(7)
        #expect(Self.value(Self.text(factory, registry), "in_flight") == 7)
    }

    @Test("more threads than shards: threads share shards and the counts still merge exactly")
    func moreThreadsThanShards() {
        let registry = PrometheusCollectorRegistry()
        let factory = Self.sharded(registry)
        let counter = Counter(label: "wrapped_total", factory: factory)
        let timer = Metrics.Timer(label: "wrapped_seconds", factory: factory)
        let metrics = GatewayMetrics(factory: factory)
        let threads = ThreadShard.count + 8
        let exclusive = Atomic<Int>(0)
        Self.onThreads(threads, warmUp: { _ in
            if ThreadShard.current.exclusive { exclusive.wrappingAdd(1, ordering: .relaxed) }
        }) { _ in
            for index in 0..<1_000 {
                counter.increment()
                timer.recordNanoseconds(Int64(index) * 1_000)
                metrics.requestFinished(route: "r", method: "GET", code: 200, duration: .microseconds(index))
            }
        }
        #expect(exclusive.load(ordering: .relaxed) <= ThreadShard.count)
        let text = Self.text(factory, registry)
        #expect(Self.value(text, "wrapped_total") == Double(threads * 1_000))
        #expect(Self.value(text, "wrapped_seconds_count") == Double(threads * 1_000))
        #expect(Self.value(text, "wrapped_seconds_sum") == Double(threads) * 499_500 / 1_000_000)
        #expect(Self.value(text, "portico_requests_total", ["route": "r", "method": "GET", "code": "200"])
            == Double(threads * 1_000))
    }

    @Test("recording takes no shared lock: a thread takes a handle cache's lock once per label set, then never")
    func noLockPerRecord() {
        let factory = Self.sharded(PrometheusCollectorRegistry())
        // Beside other audited tests: each tells its own locks apart by its threads.
        LockAudit.whileRecording {
            let metrics = GatewayMetrics(factory: factory)
            let compress = CompressMetrics(factory: factory)
            // Only a thread holding an exclusive shard keeps handles of its own; the suite runs beside
            // others whose live threads (gateways' daemon threads and loops) may hold every shard, and
            // a thread without one takes the shared path by design. The bound is for exclusive threads.
            let exclusiveThreads = Synchronization.Mutex<Set<UInt>>([])
            Self.onThreads(4, warmUp: { _ in
                if ThreadShard.current.exclusive { exclusiveThreads.withLock { _ = $0.insert(UInt(pthread_self())) } }
            }) { _ in
                for index in 0..<5_000 {
                    metrics.requestStarted()
                    metrics.firstByte(route: "r", after: .microseconds(index))
                    metrics.requestFinished(route: "r", method: index % 2 == 0 ? "GET" : "PUT", code: 200,
                                            duration: .microseconds(index))
                    compress.record(route: "r", .compressed, bytesIn: 10, bytesOut: 5)
                }
            }
            let metricLocks = LockAudit.report().filter { $0.site.file.hasPrefix("Portico/Shard") }
            #expect(!metricLocks.isEmpty)
            let exclusive = exclusiveThreads.withLock { $0 }
            for lock in metricLocks {
                // An exclusive thread: at most 2 label sets (GET, PUT) per cache, then never again.
                for (thread, acquisitions) in lock.threads where exclusive.contains(thread) {
                    #expect(acquisitions <= 2, "\(lock.site): \(acquisitions) acquisitions by one thread with its own shard")
                }
            }
        }
    }

    @Test("threads alive together hold distinct exclusive shards")
    func distinctShards() {
        let shards = Synchronization.Mutex<[ThreadShard]>([])
        Self.onThreads(8, warmUp: { _ in
            let shard = ThreadShard.current
            shards.withLock { $0.append(shard) }
        }) { _ in
            #expect(ThreadShard.current == ThreadShard.current)
        }
        let exclusive = shards.withLock { $0 }.filter(\.exclusive).map(\.index)
        #expect(Set(exclusive).count == exclusive.count)
    }

    /// The observations both factories get: timers (default and per-label buckets, with and
    /// without labels, values on bounds, above all bounds, zero) and aggregating recorders
    /// (values exactly representable, so sums do not depend on the order of addition).
    static func observe(_ factory: any MetricsFactory, thread: Int, threads: Int) {
        let routes = ["orders", "a\"quoted\\route", "line\nbreak"]
        for index in stride(from: thread, to: 3_000, by: threads) {
            let route = routes[index % routes.count]
            Metrics.Timer(label: "portico_request_duration_seconds", dimensions: [("route", route), ("method", "GET")],
                          factory: factory)
                .recordNanoseconds(Int64(index % 40) * 250_000)
            Metrics.Timer(label: "custom_seconds", factory: factory).recordNanoseconds(Int64(index) * 1_000_000)
            Recorder(label: "payload_bytes", dimensions: [("kind", index % 2 == 0 ? "even" : "odd")], factory: factory)
                .record(Double(index % 70) * 0.5)
            Recorder(label: "default_value_buckets", factory: factory).record(Int64(index * 7))
            Counter(label: "portico_cache_hits_total", dimensions: [("cache", "c")], factory: factory).increment()
            Metrics.Timer(label: "9odd-name.seconds", dimensions: [("bad:label", "v")], factory: factory)
                .recordNanoseconds(Int64(index))
            Gauge(label: "portico_build_info", dimensions: [("version", "x")], factory: factory).record(1)
        }
    }

    @Test("histograms merged from threads render exactly as swift-prometheus renders the same observations")
    func histogramsRenderAsPrometheus() throws {
        let plainRegistry = PrometheusCollectorRegistry()
        let plain = Self.prometheus(plainRegistry)
        for thread in 0..<6 { Self.observe(plain, thread: thread, threads: 6) }

        let registry = PrometheusCollectorRegistry()
        let factory = Self.sharded(registry)
        Self.onThreads(6) { thread in Self.observe(factory, thread: thread, threads: 6) }

        let expected = String(decoding: plainRegistry.emitToBuffer(), as: UTF8.self)
        let actual = Self.text(factory, registry)
        // Families come in another order (swift-prometheus: a dictionary's), lines are the same.
        #expect(actual.split(separator: "\n").sorted() == expected.split(separator: "\n").sorted())
        #expect(actual.contains(#"le="0.00025""#) && actual.contains(#"le="2.5""#) && actual.contains(#"le="1.5""#))

        // Each family's series follow its one `# TYPE` line.
        var family = ""
        var seen: Set<String> = []
        for line in actual.split(separator: "\n") {
            if line.hasPrefix("# TYPE ") {
                family = String(line.split(separator: " ")[2])
                #expect(seen.insert(family).inserted, "\(family) has two TYPE lines")
            } else {
                let name = String(line.prefix { $0 != "{" && $0 != " " })
                let suffixes = ["", "_bucket", "_sum", "_count"]
                #expect(suffixes.contains { family + $0 == name }, "\(name) outside its family \(family)")
            }
        }
    }

    @Test("the sharded /metrics text parses with Portico's own reader, every line, into what was recorded")
    func parsesWithPrometheusText() throws {
        let registry = PrometheusCollectorRegistry()
        let factory = Self.sharded(registry)
        let metrics = GatewayMetrics(factory: factory)
        Self.onThreads(4) { thread in
            for index in 0..<2_500 {
                metrics.requestStarted()
                metrics.firstByte(route: "api", after: .milliseconds(index % 7))
                metrics.requestFinished(route: "api", method: index % 2 == 0 ? "GET" : "BREW",
                                        code: index % 10 == 0 ? 503 : 200, duration: .milliseconds(index % 30))
            }
            metrics.overloaded(route: nil)
        }
        let text = Self.text(factory, registry)
        let lines = text.split(separator: "\n").filter { !$0.hasPrefix("#") }
        let samples = PrometheusText.parse(Array(text.utf8))
        #expect(samples.count == lines.count)
        #expect(samples.filter { $0.name == "portico_requests_total" }.map(\.value).reduce(0, +) == 10_000)
        #expect(Self.value(text, "portico_requests_total", ["route": "api", "method": "GET", "code": "503"]) == 1_000)
        #expect(Self.value(text, "portico_requests_total", ["route": "api", "method": "OTHER", "code": "200"]) == 5_000)
        #expect(Self.value(text, "portico_request_duration_seconds_count", ["route": "api", "method": "GET"]) == 5_000)
        #expect(Self.value(text, "portico_time_to_first_byte_seconds_count", ["route": "api"]) == 10_000)
        #expect(Self.value(text, "portico_in_flight_requests") == 0)
        #expect(Self.value(text, "portico_overloaded_requests_total", ["route": ""]) == 4)

        // What `/stats` reads from the same text.
        let snapshot = StatsSnapshot(time: 0, samples: samples)
        #expect(snapshot.routes["api"]?.requests == 10_000)
        #expect(snapshot.routes["api"]?.errors == 1_000)
        #expect(snapshot.routes["api"]?.buckets[.infinity] == 10_000)
    }

    @Test("names and label names are repaired as swift-prometheus repairs them")
    func repairs() {
        #expect(PrometheusExposition.metricName("9lives-total.x") == "_lives_total_x")
        #expect(PrometheusExposition.metricName("a:b_1") == "a:b_1")
        #expect(PrometheusExposition.labelName("a:b") == "a_b")
        #expect(PrometheusExposition.labelName("route") == "route")
        #expect(PrometheusExposition.duration(.seconds(1)) == Duration.seconds(1).bucketRepresentation)
        #expect(PrometheusExposition.duration(.microseconds(250)) == Duration.microseconds(250).bucketRepresentation)
        #expect(PrometheusExposition.duration(.nanoseconds(1_234_567_890_123)) == Duration.nanoseconds(1_234_567_890_123).bucketRepresentation)
        #expect(PrometheusExposition.duration(.zero) == Duration.zero.bucketRepresentation)
    }
}
