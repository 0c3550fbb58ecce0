@testable import Portico
import Testing

/// `concurrency: adaptive`: the limit algorithm as a value, driven window by window against a
/// model upstream (no clock, no sockets), and the runtime's windows driven with given instants.
@Suite("Resilience: adaptive concurrency")
struct AdaptiveLimitTests {
    static let ms: Int64 = 1_000_000
    static let window: Int64 = 250 * ms

    /// An upstream serving `capacity` at a time, each in `service`, queueing the rest (FIFO), offered
    /// `offered` callers at once: one window's answers at `limit` in flight.
    static func window(limit: Int, capacity: Int = 16, service: Int64 = 100 * ms, offered: Int = 200) -> AdaptiveLimit.Window {
        let inFlight = min(limit, offered)
        let latency = service * Int64(max(capacity, inFlight)) / Int64(capacity)
        let completed = Int(Int64(inFlight) * Self.window / latency)
        // With a queue every answer waited in it; without, each took the service time.
        return AdaptiveLimit.Window(completed: completed, totalLatency: latency * Int64(completed), fastest: latency,
                                    duration: Self.window)
    }

    static func config(min: Int = 4, max: Int = 1000, target: AdaptiveConcurrencyConfig.Target = .minimumTimes(1.5)) -> AdaptiveConcurrencyConfig {
        var config = AdaptiveConcurrencyConfig()
        config.min = min
        config.max = max
        config.target = target
        return config
    }

    @Test("offered 200 against a capacity of 16: the limit climbs from min, settles near 16, and served latency stays under 2×")
    func settlesNearCapacity() {
        var limit = AdaptiveLimit(config: Self.config())
        #expect(limit.currentLimit == 4)
        var seen: [Int] = []
        for _ in 0..<200 {
            limit.update(Self.window(limit: limit.currentLimit))
            seen.append(limit.currentLimit)
        }
        #expect(limit.minLatency == 100 * Self.ms)
        // It got there within a few seconds' windows, and stays in a band around the capacity.
        #expect(seen.prefix(12).contains { $0 >= 16 }, "\(seen.prefix(12))")
        let settled = seen.suffix(150)
        #expect(settled.allSatisfy { (16...32).contains($0) }, "\(settled)")
        // Served latency: proportional to the queue, at most the target (1.5×) plus one step.
        let latencies = settled.map { Double(max(16, $0)) / 16 }
        #expect(latencies.allSatisfy { $0 <= 2.0 }, "\(latencies)")
    }

    @Test("the upstream gets slower for good: the limit falls to min, the stale minimum is forgotten, and it climbs again")
    func relearnsMinimum() {
        var limit = AdaptiveLimit(config: Self.config())
        for _ in 0..<60 { limit.update(Self.window(limit: limit.currentLimit)) }
        #expect(limit.minLatency == 100 * Self.ms)
        // Now every answer takes 400 ms even unqueued, and its capacity is 8.
        var changes: [AdaptiveLimit.Change] = []
        for _ in 0..<20 {
            changes.append(limit.update(Self.window(limit: limit.currentLimit, capacity: 8, service: 400 * Self.ms)))
        }
        #expect(changes.contains(.relearning), "\(changes)")
        for _ in 0..<100 { limit.update(Self.window(limit: limit.currentLimit, capacity: 8, service: 400 * Self.ms)) }
        #expect(limit.minLatency == 400 * Self.ms)
        #expect((8...16).contains(limit.currentLimit), "\(limit.currentLimit)")
    }

    @Test("light traffic does not grow the limit: a window that used less than half of it proves nothing")
    func applicationLimited() {
        var limit = AdaptiveLimit(config: Self.config(min: 10))
        // Two callers at a time, each answered in 10 ms: far from the limit of 10.
        for _ in 0..<50 {
            #expect(limit.update(Self.window(limit: limit.currentLimit, service: 10 * Self.ms, offered: 2)) == .held)
        }
        #expect(limit.currentLimit == 10)
        // Five at a time (half of it) and fast: it grows.
        #expect(limit.update(Self.window(limit: limit.currentLimit, service: 10 * Self.ms, offered: 5)) == .grew)
    }

    @Test("bounds and edges: never above max nor below min; no answers, no change; a fixed target")
    func boundsAndTargets() {
        var capped = AdaptiveLimit(config: Self.config(min: 2, max: 12))
        for _ in 0..<50 { capped.update(Self.window(limit: capped.currentLimit, capacity: 1000)) }
        #expect(capped.currentLimit == 12)
        #expect(capped.update(AdaptiveLimit.Window(completed: 0, totalLatency: 0, fastest: nil, duration: Self.window)) == .held)
        // A fixed target of 200 ms on an upstream of 100 ms and 16 at a time: 32 in flight is at the target.
        var fixed = AdaptiveLimit(config: Self.config(target: .fixed(.milliseconds(200))))
        for _ in 0..<200 { fixed.update(Self.window(limit: fixed.currentLimit)) }
        #expect((24...40).contains(fixed.currentLimit), "\(fixed.currentLimit)")
        // Overloaded from the first window (every answer slow): down to min, never below.
        var floor = AdaptiveLimit(config: Self.config(min: 3, target: .fixed(.milliseconds(10))))
        for _ in 0..<20 { floor.update(Self.window(limit: floor.currentLimit, capacity: 1)) }
        #expect(floor.currentLimit == 3)
    }

    @Test("the runtime: samples land in the caller's row; the first caller past the window's end works out the new limit")
    func runtimeWindows() throws {
        var config = Self.config()
        config.sampleWindow = .milliseconds(250)
        let adaptive = AdaptiveConcurrency(config: config, upstream: "u", rows: 3, origin: .now)
        #expect(adaptive.limit == 4)
        // Admission stops at the limit, and starts again as requests finish.
        for _ in 0..<4 { try adaptive.admit() }
        #expect(throws: GatewayError.self) { try adaptive.admit() }
        #expect(adaptive.current == 4)
        adaptive.release()
        try adaptive.admit()
        for _ in 0..<4 { adaptive.release() }
        #expect(adaptive.current == 0)
        // A window's answers over two loops' rows, 100 ms each, about 4 in flight (the limit in
        // use): it grows when a caller finds the window over.
        for step in 1...10 {
            adaptive.record(latency: 100 * Self.ms, row: step % 2, at: Int64(step) * 24 * Self.ms)
        }
        #expect(adaptive.limit == 4, "before the window closes")
        adaptive.record(latency: 100 * Self.ms, row: 2, at: 260 * Self.ms)
        #expect(adaptive.limit == 6)
        #expect(adaptive.minLatency == .milliseconds(100))
        // The next window: each loop's fastest counts afresh, the totals by difference. Answers of
        // 400 ms against a target of 150: 6 × 150/400 would be 2.25, but never below half at once
        // (3), nor below min (4).
        adaptive.record(latency: 400 * Self.ms, row: 0, at: 300 * Self.ms)
        adaptive.record(latency: 400 * Self.ms, row: 1, at: 520 * Self.ms)
        #expect(adaptive.limit == 4)
        #expect(adaptive.minLatency == .milliseconds(100))
    }
}
