import CoreMetrics
import Metrics

/// One counter family (`portico_retries_total`) whose handles are created once per label set
/// and then reused: creating a handle per request would go through the metrics factory's
/// lock every time. Each thread keeps its own cells of each (`HandleCache`), so an increment
/// takes no lock. Handles are made lazily, so a family held in a `static let` is created
/// after the command has bootstrapped the backend. Label values must come from a bounded set
/// (configuration names, fixed kinds).
final class LabelledCounters: Sendable {
    let label: String
    private let counters: HandleCache<[String], any CounterHandler, CounterCell>

    init(_ label: String, factory: any MetricsFactory = MetricsSystem.factory) {
        self.label = label
        counters = HandleCache(make: { key in
            let dimensions = stride(from: 0, to: key.count - 1, by: 2).map { (key[$0], key[$0 + 1]) }
            return factory.makeCounter(label: label, dimensions: dimensions)
        }, localize: CounterCell.init)
    }

    func increment(_ dimensions: [(String, String)], by amount: Int64 = 1) {
        counters[dimensions.flatMap { [$0.0, $0.1] }].increment(by: amount)
    }
}

/// Gauges of one label whose label sets are made at run time (bounded by configuration), kept
/// like `LabelledCounters`: made once per label set, then found without a lock.
final class LabelledGauges: Sendable {
    let label: String
    private let gauges: HandleCache<[String], any RecorderHandler, any RecorderHandler>

    init(_ label: String, factory: any MetricsFactory = MetricsSystem.factory) {
        self.label = label
        gauges = HandleCache(make: { key in
            let dimensions = stride(from: 0, to: key.count - 1, by: 2).map { (key[$0], key[$0 + 1]) }
            return factory.makeRecorder(label: label, dimensions: dimensions, aggregate: false)
        }, localize: { handler, _ in handler })
    }

    func record(_ value: Double, _ dimensions: [(String, String)]) {
        gauges[dimensions.flatMap { [$0.0, $0.1] }].record(value)
    }
}
