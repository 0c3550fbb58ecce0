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
