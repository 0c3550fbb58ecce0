import HTTPTypes
import LockAudit
import Metrics
import Synchronization

/// `concurrency: adaptive`: the upstream's requests in flight, capped by a limit that follows its
/// latency (`AdaptiveLimit`). Past the limit a request is refused at once, `503
/// upstream_overloaded` with `Retry-After`, as the breaker does.
///
/// **What the request path touches.** Admission is the breaker's: one `SharedCap` every loop
/// writes twice per request (the one shared word, as with `circuit_breaker`), checked against
/// `limitWord`, a word written once per window and otherwise only loaded. A sample (an answer's
/// latency) is added to the calling loop's own row (`LoopSlots`: its sum, count and fastest, which
/// no other loop writes), then the window's end is loaded. The one request that finds the window
/// over claims it with a compare-and-exchange and works out the new limit from every row (loads
/// only) under `state`'s lock: taken once per window by one thread, never per request, so no
/// success waits on it.
///
/// A reload that keeps the upstream's `adaptive_concurrency` hands this object to its successor
/// whole (the limit, the minimum and the requests in flight, which finish on it).
///
/// - `portico_upstream_concurrency_limit{upstream}`: the limit now.
/// - `portico_upstream_min_latency_seconds{upstream}`: the minimum latency it measures against.
/// - `portico_upstream_overloaded_total{upstream,reason="adaptive"}`: refusals past the limit.
final class AdaptiveConcurrency: Sendable {
    let config: AdaptiveConcurrencyConfig
    private let upstream: String
    private let inFlight: SharedCap
    private let limitWord: Atomic<Int>
    private let minLatencyWord = Atomic<Int64>(0)
    /// The instant (nanoseconds since `origin`) the current window closes at.
    private let windowEnd: Atomic<Int64>
    /// Bumped at each window's close: a loop whose fastest is of an older epoch starts it anew.
    private let epoch = Atomic<Int>(1)
    private let window: Int64
    private let origin: ContinuousClock.Instant
    /// One per loop, and one for callers on none: [latency sum, answers, fastest, its epoch].
    private let rows: [LoopSlots]
    private let state: Mutex<State>
    private let limitGauge: Gauge
    private let minLatencyGauge: Gauge
    private let refusals: Counter

    private struct State {
        var limit: AdaptiveLimit
        /// Each row's sum and count at the last close.
        var sums: [Int]
        var counts: [Int]
        var closedAt: Int64
        var lastChange: AdaptiveLimit.Change = .held
    }

    private enum Slot {
        static let sum = 0, count = 1, fastest = 2, epoch = 3, width = 4
    }

    /// `rows`: the gateway's loops and one more (`EventLoops.count + 1`).
    init(config: AdaptiveConcurrencyConfig, upstream: String, rows: Int, origin: ContinuousClock.Instant,
         metricsFactory: any MetricsFactory = MetricsSystem.factory) {
        self.config = config
        self.upstream = upstream
        self.origin = origin
        let limit = AdaptiveLimit(config: config)
        inFlight = SharedCap(name: "upstreams.\(upstream).concurrency")
        limitWord = Atomic(limit.currentLimit)
        window = OutlierDetector.nanoseconds(config.sampleWindow)
        windowEnd = Atomic(window)
        self.rows = (0..<max(1, rows)).map { _ in LoopSlots(count: Slot.width) }
        state = Mutex(State(limit: limit, sums: Array(repeating: 0, count: max(1, rows)),
                            counts: Array(repeating: 0, count: max(1, rows)), closedAt: 0))
        let dimensions = [("upstream", upstream)]
        limitGauge = Gauge(label: "portico_upstream_concurrency_limit", dimensions: dimensions, factory: metricsFactory)
        minLatencyGauge = Gauge(label: "portico_upstream_min_latency_seconds", dimensions: dimensions, factory: metricsFactory)
        refusals = Counter(label: "portico_upstream_overloaded_total", dimensions: dimensions + [("reason", "adaptive")],
                           factory: metricsFactory)
        limitGauge.record(limit.currentLimit)
        minLatencyGauge.record(0)
    }

    // MARK: The request path

    /// Counts one more request in flight, or refuses it (`upstream_overloaded`, counted).
    func admit() throws(GatewayError) {
        guard inFlight.tryAcquire(limit: limitWord.load(ordering: .relaxed)) else { throw refusal() }
    }

    /// One admitted request's response is over.
    func release() {
        inFlight.release()
    }

    /// An admitted request's answer came (its head, or a timeout) `latency` after it was sent.
    /// `row`: the calling loop's index (`EventLoops.count` off the loops).
    func record(latency: Duration, row: Int, at now: ContinuousClock.Instant) {
        record(latency: OutlierDetector.nanoseconds(latency), row: row, at: OutlierDetector.nanoseconds(origin.duration(to: now)))
    }

    /// `record` in nanoseconds (`now` since `origin`): the tests' entry.
    func record(latency: Int64, row index: Int, at now: Int64) {
        let row = rows[min(max(0, index), rows.count - 1)]
        let latency = Int(max(1, latency))
        row.add(Slot.sum, latency)
        row.add(Slot.count, 1)
        let epoch = epoch.load(ordering: .relaxed)
        if row.load(Slot.epoch) != epoch {
            row.store(Slot.fastest, latency)
            row.store(Slot.epoch, epoch)
        } else if latency < row.load(Slot.fastest) {
            row.store(Slot.fastest, latency)
        }
        let end = windowEnd.load(ordering: .relaxed)
        guard now >= end, windowEnd.compareExchange(expected: end, desired: now + window, ordering: .relaxed).exchanged else { return }
        close(at: now)
    }

    /// The window is over (this caller claimed it): the new limit from every row.
    private func close(at now: Int64) {
        let current = epoch.load(ordering: .relaxed)
        let (limit, minimum) = state.withLock { state -> (Int, Int64?) in
            var completed = 0, total = 0
            var fastest: Int64?
            for (index, row) in rows.enumerated() {
                let sum = row.load(Slot.sum), count = row.load(Slot.count)
                completed += count &- state.counts[index]
                total &+= sum &- state.sums[index]
                state.sums[index] = sum
                state.counts[index] = count
                if row.load(Slot.epoch) == current {
                    let own = Int64(row.load(Slot.fastest))
                    if own > 0 { fastest = min(fastest ?? own, own) }
                }
            }
            state.lastChange = state.limit.update(AdaptiveLimit.Window(
                completed: completed, totalLatency: Int64(total), fastest: fastest, duration: max(1, now - state.closedAt)))
            state.closedAt = now
            return (state.limit.currentLimit, state.limit.minLatency)
        }
        epoch.wrappingAdd(1, ordering: .relaxed)
        limitWord.store(limit, ordering: .relaxed)
        minLatencyWord.store(minimum ?? 0, ordering: .relaxed)
        limitGauge.record(limit)
        minLatencyGauge.record(Double(minimum ?? 0) / 1e9)
    }

    // MARK: Reading (reports: loads only)

    /// Requests admitted at once now.
    var limit: Int { limitWord.load(ordering: .relaxed) }
    /// Requests counted now.
    var current: Int { max(0, inFlight.current) }
    /// The minimum latency the limit is measured against (`nil` before the first window).
    var minLatency: Duration? {
        let nanoseconds = minLatencyWord.load(ordering: .relaxed)
        return nanoseconds > 0 ? .nanoseconds(nanoseconds) : nil
    }

    private func refusal() -> GatewayError {
        refusals.increment()
        var fields = HTTPFields()
        fields[.retryAfter] = "1"
        return GatewayError(.upstreamOverloaded,
                            message: "upstream \(upstream) has \(limit) requests in flight (its adaptive concurrency limit); retry later",
                            headerFields: fields)
    }
}
