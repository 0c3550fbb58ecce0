/// The arithmetic of `concurrency: adaptive`, as a value: one window's answers in, the upstream's
/// new limit out. No clock, no atomics: `AdaptiveConcurrency` feeds it and the tests drive it.
///
/// A gradient controller in the manner of Envoy's adaptive concurrency filter and Netflix's
/// Gradient, on the minimum latency:
/// - **The minimum** is the fastest answer seen (each window's fastest, kept while lower): what
///   the upstream answers in when nothing queues. The target is that × `target_latency`'s factor
///   (or a fixed latency).
/// - **At or under the target** the upstream is not queueing: the limit grows by √limit (fast
///   from a low limit, slower as it gets high) times the headroom left, (target − average) ÷
///   (target − minimum), at least by one; but only when the window used at least half of it
///   (Little's law: completions × average latency ÷ window): light traffic proves nothing about
///   what the upstream can take, and a limit grown idle would let the next burst through whole.
/// - **Over the target** the limit is scaled by target ÷ average (never below half at once):
///   latency proportional to the queue brings the limit back to what the upstream serves in
///   about the target, in one or two windows.
/// - **Re-learning.** When the limit sits at `min` and answers still miss the target for three
///   windows, the minimum is stale (the upstream itself got slower: at `min` nothing queues): it
///   is forgotten and learnt again from the next window's answers.
///
/// Why a gradient rather than AIMD: AIMD halves the limit on a sign of overload and climbs back
/// one request per window, a saw-tooth that spends most of its time away from the capacity
/// (from 8 back to 16 at 250 ms a window: two seconds of wasted capacity, each time); the
/// gradient moves in proportion to how far latency is from the target, so it settles in a band
/// near the capacity and follows it when the upstream changes.
struct AdaptiveLimit: Sendable, Equatable {
    /// One window's answers.
    struct Window: Sendable, Equatable {
        /// Answers (heads, or timeouts) in the window.
        var completed: Int
        /// Their latencies' sum, in nanoseconds.
        var totalLatency: Int64
        /// The fastest of them (nanoseconds), `nil` when not known.
        var fastest: Int64?
        /// The window's length, in nanoseconds.
        var duration: Int64

        var average: Double { completed > 0 ? Double(totalLatency) / Double(completed) : 0 }
    }

    enum Change: Sendable, Equatable {
        case grew, shrank, held
        /// Held at `min` and still slow: the minimum was forgotten.
        case relearning
    }

    let config: AdaptiveConcurrencyConfig
    /// Not rounded: growth by √limit adds fractions.
    private(set) var limit: Double
    /// The lowest latency seen (nanoseconds); `nil` before the first answers (and when re-learning).
    private(set) var minLatency: Int64?
    private var slowWindowsAtMinimum = 0

    /// Windows at `min` over the target before the minimum is learnt again.
    static let windowsBeforeRelearning = 3

    init(config: AdaptiveConcurrencyConfig) {
        self.config = config
        limit = Double(config.initial)
    }

    /// Requests admitted at once now.
    var currentLimit: Int { Int(limit.rounded(.down)) }

    /// The latency aimed at (nanoseconds), once a minimum is known.
    var targetLatency: Double? {
        switch config.target {
        case .fixed(let duration): Double(OutlierDetector.nanoseconds(duration))
        case .minimumTimes(let factor): minLatency.map { Double($0) * factor }
        }
    }

    /// The limit after `window`.
    @discardableResult
    mutating func update(_ window: Window) -> Change {
        guard window.completed > 0, window.duration > 0 else { return .held }
        let average = window.average
        if let fastest = window.fastest, fastest > 0 {
            minLatency = Swift.min(minLatency ?? fastest, fastest)
        }
        guard let target = targetLatency else {
            minLatency = Int64(average)
            return .held
        }
        if average <= target {
            slowWindowsAtMinimum = 0
            let used = average * Double(window.completed) / Double(window.duration)
            guard used * 2 >= limit, limit < Double(config.max) else { return .held }
            // Full steps while nothing queues, smaller as the latency nears the target (at least
            // one request, to keep probing): it settles just under the target, not in a saw-tooth over it.
            let minimum = Double(minLatency ?? Int64(average))
            let headroom = target > minimum ? Swift.min(1, Swift.max(0, (target - average) / (target - minimum))) : 1
            limit = Swift.min(Double(config.max), limit + Swift.max(1, limit.squareRoot() * headroom))
            return .grew
        }
        let floor = Double(config.min)
        if limit <= floor {
            slowWindowsAtMinimum += 1
            if case .minimumTimes = config.target, slowWindowsAtMinimum >= Self.windowsBeforeRelearning {
                slowWindowsAtMinimum = 0
                minLatency = nil
                return .relearning
            }
            return .held
        }
        limit = Swift.max(floor, limit * Swift.max(0.5, target / average))
        return .shrank
    }
}
