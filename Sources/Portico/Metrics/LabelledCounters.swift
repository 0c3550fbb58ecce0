import CoreMetrics
import Metrics
import Synchronization

/// One counter family (`portico_retries_total`) whose handles are created once per label set
/// and then reused: creating a handle per request would go through the metrics factory's
/// lock every time. Handles are made lazily, so a family held in a `static let` is created
/// after the command has bootstrapped the backend. Label values must come from a bounded set
/// (configuration names, fixed kinds).
final class LabelledCounters: Sendable {
    let label: String
    private let factory: any MetricsFactory
    private let counters = Mutex<[[String]: Counter]>([:])

    init(_ label: String, factory: any MetricsFactory = MetricsSystem.factory) {
        self.label = label
        self.factory = factory
    }

    func increment(_ dimensions: [(String, String)]) {
        let key = dimensions.flatMap { [$0.0, $0.1] }
        let counter = counters.withLock { counters in
            if let existing = counters[key] { return existing }
            let created = Counter(label: label, dimensions: dimensions, factory: factory)
            counters[key] = created
            return created
        }
        counter.increment()
    }
}
