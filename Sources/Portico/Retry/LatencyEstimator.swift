import Synchronization

/// Recent upstream latency of one route, as a percentile, for a hedge's `after: pNN`.
///
/// Bounded and shared-nothing on the request path: each thread shard keeps a ring of its last
/// `samplesPerShard` samples in its own cells (`CellSlab`: 128 bytes apart), written with relaxed
/// atomics, so recording writes no line another core writes. A shard also caches the percentile
/// it last computed; it recomputes it at most every `refresh` (by the injected clock) by merging
/// every shard's ring — a few hundred loads and a sort of what it found, off the common path.
/// Samples older than `window` are left out, so an estimate follows the upstream as it changes;
/// with fewer than `minimumSamples` recent ones there is no estimate (and no hedge).
///
/// A sample is one cell: the instant it was taken (milliseconds since `reference`, plus one, so an
/// empty cell is 0) in the high 40 bits, its latency in microseconds (at most about 16.7 s) in
/// the low 24.
final class LatencyEstimator: Sendable {
    struct Settings: Sendable, Equatable {
        /// 50 to 99.9.
        var percentile: Double
        var window: Duration = .seconds(30)
        var refresh: Duration = .milliseconds(100)
        var minimumSamples = 16
    }

    static let samplesPerShard = 64
    /// Cells per shard: the ring's next index, the ring, the cached estimate (microseconds plus
    /// one; 0: none), and the tick it stays valid until.
    private static let cellCount = samplesPerShard + 3
    private static let estimateCell = samplesPerShard + 1
    private static let validUntilCell = samplesPerShard + 2

    static let latencyBits = 24
    static let maxMicroseconds: Int64 = (1 << latencyBits) - 1
    /// Ticks count from a day before the process first asked, so that every instant a clock in this
    /// process gives (a test's manual clock included) is a positive tick.
    static let reference = ContinuousClock.now.advanced(by: .seconds(-86_400))

    let settings: Settings
    private let slab: CellSlab

    init(_ settings: Settings) {
        self.settings = settings
        slab = CellSlab(cellsPerShard: Self.cellCount)
    }

    /// The cells one shard writes, without a reference to the slab (whose count every thread
    /// would touch): valid while the estimator lives.
    var view: View { View(base: UnsafeMutableRawPointer(slab.cell(shard: 0, 0)), stride: slab.stride, settings: settings) }

    func record(_ latency: Duration, at now: ContinuousClock.Instant) {
        view.record(latency, at: now)
    }

    func estimate(at now: ContinuousClock.Instant) -> Duration? {
        view.estimate(at: now)
    }

    struct View: @unchecked Sendable {
        // @unchecked: `base` points into a `CellSlab` the estimator keeps alive as long as a view
        // is used (the middleware owns both); its cells are atomics.
        let base: UnsafeMutableRawPointer
        let stride: Int
        let settings: Settings

        @inline(__always)
        private func cells(_ shard: Int) -> UnsafeMutablePointer<Atomic<Int64>> {
            (base + shard * stride).assumingMemoryBound(to: Atomic<Int64>.self)
        }

        /// Adds one sample to the calling thread's ring.
        func record(_ latency: Duration, at now: ContinuousClock.Instant, shard: Int = ThreadShard.current.index) {
            let own = cells(shard)
            let index = own[0].wrappingAdd(1, ordering: .relaxed).oldValue
            let slot = 1 + Int(index.magnitude % UInt64(LatencyEstimator.samplesPerShard))
            own[slot].store(LatencyEstimator.pack(tick: LatencyEstimator.tick(now), latency: latency), ordering: .relaxed)
        }

        /// The percentile of recent samples, `nil` while there are too few.
        func estimate(at now: ContinuousClock.Instant, shard: Int = ThreadShard.current.index) -> Duration? {
            let own = cells(shard)
            let tick = LatencyEstimator.tick(now)
            let cached: Int64
            if tick < own[LatencyEstimator.validUntilCell].load(ordering: .relaxed) {
                cached = own[LatencyEstimator.estimateCell].load(ordering: .relaxed)
            } else {
                cached = compute(tick: tick).map { $0 + 1 } ?? 0
                own[LatencyEstimator.estimateCell].store(cached, ordering: .relaxed)
                own[LatencyEstimator.validUntilCell].store(tick + LatencyEstimator.milliseconds(settings.refresh), ordering: .relaxed)
            }
            return cached > 0 ? .microseconds(cached - 1) : nil
        }

        /// Merges every shard's recent samples: the percentile in microseconds.
        func compute(tick: Int64) -> Int64? {
            let oldest = tick - LatencyEstimator.milliseconds(settings.window)
            var samples: [Int64] = []
            for shard in 0..<ThreadShard.count {
                let ring = cells(shard)
                let written = ring[0].load(ordering: .relaxed)
                guard written != 0 else { continue }
                for slot in 1...min(Int(written.magnitude), LatencyEstimator.samplesPerShard) {
                    let sample = ring[slot].load(ordering: .relaxed)
                    guard sample != 0, sample >> LatencyEstimator.latencyBits >= oldest else { continue }
                    samples.append(sample & LatencyEstimator.maxMicroseconds)
                }
            }
            guard samples.count >= max(1, settings.minimumSamples) else { return nil }
            samples.sort()
            return samples[LatencyEstimator.rank(settings.percentile, of: samples.count)]
        }
    }

    /// The index of the `percentile`th of `count` sorted samples (nearest rank).
    static func rank(_ percentile: Double, of count: Int) -> Int {
        let rank = Int((percentile / 100 * Double(count)).rounded(.up))
        return min(count - 1, max(0, rank - 1))
    }

    static func tick(_ now: ContinuousClock.Instant) -> Int64 {
        max(1, milliseconds(reference.duration(to: now)) + 1)
    }

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds &* 1000 &+ attoseconds / 1_000_000_000_000_000
    }

    static func pack(tick: Int64, latency: Duration) -> Int64 {
        let (seconds, attoseconds) = latency.components
        let micros = max(0, min(maxMicroseconds, seconds &* 1_000_000 &+ attoseconds / 1_000_000_000_000))
        return tick << latencyBits | micros
    }
}

/// The estimators of the routes one retry middleware serves, by route name (routes come from
/// the configuration, so the set is bounded). Each thread finds its route's estimator in its own
/// shard (`HandleCache`): no lock and no shared reference count per request.
final class RouteLatencies: Sendable {
    let settings: LatencyEstimator.Settings
    private let estimators: HandleCache<String, LatencyEstimator, LatencyEstimator.View>

    init(_ settings: LatencyEstimator.Settings) {
        self.settings = settings
        estimators = HandleCache(make: { _ in LatencyEstimator(settings) }, localize: { estimator, _ in estimator.view })
    }

    subscript(route: String) -> LatencyEstimator.View { estimators[route] }
}
