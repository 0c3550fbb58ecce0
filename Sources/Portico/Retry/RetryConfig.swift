/// `type: retry` — which failures are retried, how often, how far apart, and how much extra
/// load retries may add in total.
public struct RetryConfig: Sendable, Equatable {
    /// What makes an attempt worth repeating.
    public enum Condition: Sendable, Hashable, CustomStringConvertible {
        /// The upstream could not be reached (refused, unreachable, DNS).
        case connectError
        /// The attempt ran out of time (connect timeout, exchange timeout, per-try timeout).
        case timeout
        /// The connection broke after it was established.
        case reset
        /// The upstream answered with this status (5xx, or 429 when listed).
        case status(Int)

        public var description: String {
            switch self {
            case .connectError: "connect_error"
            case .timeout: "timeout"
            case .reset: "reset"
            case .status(let code): String(code)
            }
        }
    }

    /// Total attempts, the first included.
    public var attempts: Int = 3
    public var on: [Condition] = [.connectError, .timeout, .reset, .status(502), .status(503), .status(504)]
    /// Upper-cased. Idempotent methods by default (RFC 9110 §9.2.2); POST/PATCH only when listed.
    public var methods: [String] = ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]
    /// The first retry waits up to `backoffBase`, doubling per retry up to `backoffCap` (full jitter).
    public var backoffBase: Duration = .milliseconds(25)
    public var backoffCap: Duration = .seconds(1)
    /// Each attempt's own deadline, always inside the request's overall deadline.
    public var perTryTimeout: Duration?
    /// Retries may add at most this fraction on top of the requests in the budget window.
    public var budget: Double = 0.2
    /// Retries always allowed regardless of traffic, so a quiet route can still retry.
    public var minRetriesPerSecond: Int = 3
    /// A `Retry-After` longer than this is not waited for: the response goes back at once.
    public var maxRetryAfter: Duration = .seconds(5)
    /// Race a slow attempt with another (`hedge:`); `nil`: attempts only follow failures.
    public var hedge: HedgeConfig?

    public init() {}
}
