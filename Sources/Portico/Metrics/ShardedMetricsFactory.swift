import CoreMetrics

/// A `MetricsFactory` that keeps what requests record per thread (issue #33) and merges it only
/// when the metrics are read.
///
/// - Counters and meters write the calling thread's cell (`ThreadShard`); `flush()` adds what
///   the cells gained since the last flush to the backend's handles, which render as before.
/// - Timers and aggregating recorders are histograms kept here entirely (a backend histogram
///   cannot take bucket counts in bulk): `appendHistograms(to:)` renders them in
///   swift-prometheus's text format with the bucket bounds of `buckets` (the backend never sees
///   them, so their families appear once).
/// - Gauges (`Recorder` without aggregation), floating-point counters go to the backend as they
///   are: a gauge's value is the last one set, which shards cannot merge.
///
/// `exposition(_:)` is the whole read: flush, render the backend, append the histograms. Handle
/// creation takes this factory's lock; recording never does.
public final class ShardedMetricsFactory: MetricsFactory, Sendable {
    /// Bucket bounds, as `PrometheusMetricsFactory` configures them.
    public struct Buckets: Sendable {
        public var defaultDuration: [Duration]
        /// By metric label (before any name repair).
        public var duration: [String: [Duration]]
        public var defaultValue: [Double]
        public var value: [String: [Double]]

        public init(defaultDuration: [Duration], duration: [String: [Duration]] = [:],
                    defaultValue: [Double], value: [String: [Double]] = [:]) {
            self.defaultDuration = defaultDuration
            self.duration = duration
            self.defaultValue = defaultValue
            self.value = value
        }
    }

    private struct SeriesKey: Hashable {
        var name: String
        var labels: [String]

        init(_ name: String, _ labels: [(String, String)]) {
            self.name = name
            self.labels = labels.flatMap { [$0.0, $0.1] }
        }
    }

    private enum Kind: String {
        case counter, gauge, durationHistogram = "duration histogram", valueHistogram = "value histogram"
    }

    private struct Registry {
        var counters: [SeriesKey: ShardedCounter] = [:]
        var meters: [SeriesKey: ShardedMeter] = [:]
        var histograms: [SeriesKey: any ShardedHistogram] = [:]
        /// Histogram series in the order they were made, for a stable rendering.
        var histogramOrder: [SeriesKey] = []
        var kinds: [String: Kind] = [:]

        /// swift-prometheus refuses a name with two types; so does this, for the histograms it
        /// keeps apart from the backend (the backend checks its own).
        mutating func claim(_ name: String, as kind: Kind) {
            if let existing = kinds[name], existing != kind {
                preconditionFailure("metric \(name) is a \(existing.rawValue); it cannot also be a \(kind.rawValue)")
            }
            kinds[name] = kind
        }
    }

    public let base: any MetricsFactory
    public let buckets: Buckets
    private let arena = CellArena()
    private let registry = Mutex(Registry())

    public init(base: any MetricsFactory, buckets: Buckets) {
        self.base = base
        self.buckets = buckets
    }

    // MARK: Making handles

    public func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        let key = SeriesKey(label, dimensions)
        return registry.withLock { registry in
            registry.claim(PrometheusExposition.metricName(label), as: .counter)
            if let existing = registry.counters[key] { return existing }
            let counter = ShardedCounter(base: base.makeCounter(label: label, dimensions: dimensions),
                                         cells: arena.allocate(1))
            registry.counters[key] = counter
            return counter
        }
    }

    public func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any FloatingPointCounterHandler {
        registry.withLock { $0.claim(PrometheusExposition.metricName(label), as: .counter) }
        return base.makeFloatingPointCounter(label: label, dimensions: dimensions)
    }

    public func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
        let key = SeriesKey(label, dimensions)
        return registry.withLock { registry in
            registry.claim(PrometheusExposition.metricName(label), as: .gauge)
            if let existing = registry.meters[key] { return existing }
            let meter = ShardedMeter(base: base.makeMeter(label: label, dimensions: dimensions), cells: arena.allocate(1))
            registry.meters[key] = meter
            return meter
        }
    }

    public func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        guard aggregate else {
            registry.withLock { $0.claim(PrometheusExposition.metricName(label), as: .gauge) }
            return base.makeRecorder(label: label, dimensions: dimensions, aggregate: false)
        }
        let bounds = buckets.value[label] ?? buckets.defaultValue
        return histogram(label, dimensions, kind: .valueHistogram) { name, labels in
            ShardedValueHistogram(name: name, labels: labels, buckets: bounds, arena: arena)
        }
    }

    public func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
        let bounds = buckets.duration[label] ?? buckets.defaultDuration
        return histogram(label, dimensions, kind: .durationHistogram) { name, labels in
            ShardedTimer(name: name, labels: labels, buckets: bounds, arena: arena)
        }
    }

    /// Made once per name and label set, like swift-prometheus's registry; names and label
    /// names repaired as it repairs them.
    private func histogram<Handler: ShardedHistogram>(
        _ label: String, _ dimensions: [(String, String)], kind: Kind,
        make: (String, [(String, String)]) -> Handler
    ) -> Handler {
        let name = PrometheusExposition.metricName(label)
        let labels = dimensions.map { (PrometheusExposition.labelName($0.0), $0.1) }
        let key = SeriesKey(name, labels)
        return registry.withLock { registry in
            registry.claim(name, as: kind)
            if let existing = registry.histograms[key] as? Handler { return existing }
            let histogram = make(name, labels)
            registry.histograms[key] = histogram
            registry.histogramOrder.append(key)
            return histogram
        }
    }

    // MARK: Destroying handles

    public func destroyCounter(_ handler: any CounterHandler) {
        guard let counter = handler as? ShardedCounter else { return base.destroyCounter(handler) }
        registry.withLock { registry in
            registry.counters = registry.counters.filter { $0.value !== counter }
        }
        base.destroyCounter(counter.base)
    }

    public func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) {
        base.destroyFloatingPointCounter(handler)
    }

    public func destroyMeter(_ handler: any MeterHandler) {
        guard let meter = handler as? ShardedMeter else { return base.destroyMeter(handler) }
        registry.withLock { registry in
            registry.meters = registry.meters.filter { $0.value !== meter }
        }
        base.destroyMeter(meter.base)
    }

    public func destroyRecorder(_ handler: any RecorderHandler) {
        guard let histogram = handler as? ShardedValueHistogram else { return base.destroyRecorder(handler) }
        forget(histogram)
    }

    public func destroyTimer(_ handler: any TimerHandler) {
        guard let histogram = handler as? ShardedTimer else { return base.destroyTimer(handler) }
        forget(histogram)
    }

    private func forget(_ histogram: any ShardedHistogram) {
        registry.withLock { registry in
            guard let key = registry.histograms.first(where: { $0.value === histogram })?.key else { return }
            registry.histograms[key] = nil
            registry.histogramOrder.removeAll { $0 == key }
        }
    }

    // MARK: Reading

    /// Adds what every counter and meter gained since the last flush to the backend's handles.
    public func flush() {
        let (counters, meters) = registry.withLock { (Array($0.counters.values), Array($0.meters.values)) }
        for counter in counters { counter.flush() }
        for meter in meters { meter.flush() }
    }

    /// Every histogram, a `# TYPE` line per family (families by name).
    public func appendHistograms(to buffer: inout [UInt8]) {
        let histograms = registry.withLock { registry in registry.histogramOrder.compactMap { registry.histograms[$0] } }
        var families: [String: [any ShardedHistogram]] = [:]
        for histogram in histograms { families[histogram.name, default: []].append(histogram) }
        for name in families.keys.sorted() {
            PrometheusExposition.typeLine(name, "histogram", into: &buffer)
            for histogram in families[name] ?? [] { histogram.emit(into: &buffer) }
        }
    }

    /// The text `/metrics` serves: flushed, then `renderBase` (the backend's registry), then the
    /// histograms.
    public func exposition(_ renderBase: () -> [UInt8]) -> [UInt8] {
        flush()
        var buffer = renderBase()
        appendHistograms(to: &buffer)
        return buffer
    }
}
