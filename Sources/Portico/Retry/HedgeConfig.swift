/// `hedge:` under `type: retry` — when an attempt still without a response head is raced by
/// another, and how many such extra attempts one request may send.
public struct HedgeConfig: Sendable, Equatable {
    /// How long the first attempt runs alone.
    public enum Delay: Sendable, Equatable, CustomStringConvertible {
        /// A fixed delay (`after: 50ms`).
        case fixed(Duration)
        /// This percentile of the route's recent upstream latency (`after: p90`), 50 to 99.9.
        case percentile(Double)

        public var description: String {
            switch self {
            case .fixed(let delay): delay.configText
            case .percentile(let p): "p" + (p == p.rounded() ? String(Int(p)) : String(p))
            }
        }
    }

    public var after: Delay = .percentile(90)
    /// The delay is never shorter: a fast upstream's p90 of 1 ms would hedge nearly everything.
    public var min: Duration = .milliseconds(20)
    /// Extra attempts one request may send in all (each also takes one from the retry budget).
    public var maxExtra: Int = 1

    public init(after: Delay = .percentile(90), min: Duration = .milliseconds(20), maxExtra: Int = 1) {
        self.after = after
        self.min = min
        self.maxExtra = maxExtra
    }

    /// Methods a hedge may repeat: RFC 9110 §9.2.2's idempotent ones. Two copies of one of these
    /// may both reach the upstream; of any other method that could act twice.
    public static let idempotentMethods: Set<String> = ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"]

    /// The percentiles `after:` accepts.
    public static let percentiles: ClosedRange<Double> = 50...99.9
}
