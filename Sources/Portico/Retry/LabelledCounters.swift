import Metrics
import Synchronization

/// One counter family (`portico_retries_total`) whose handles are created once per label set
/// and then reused: creating a handle per request would go through the metrics factory's
/// lock every time. Handles are made lazily, after the command has bootstrapped the backend.
final class LabelledCounters: Sendable {
    let label: String
    private let counters = Mutex<[[String]: Counter]>([:])

    init(_ label: String) {
        self.label = label
    }

    func increment(_ dimensions: [(String, String)]) {
        let key = dimensions.flatMap { [$0.0, $0.1] }
        let counter = counters.withLock { counters in
            if let existing = counters[key] { return existing }
            let created = Counter(label: label, dimensions: dimensions)
            counters[key] = created
            return created
        }
        counter.increment()
    }
}
