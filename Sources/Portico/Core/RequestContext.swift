import Logging
import Synchronization

/// What travels with a request through the chain besides the request itself.
public struct RequestContext: Sendable {
    /// The request id: the client's `X-Request-ID` when well-formed, generated otherwise.
    public var requestID: String
    /// The matched route's name (`nil` before routing).
    public var route: String?
    /// The upstream the route forwards to, if any.
    public var upstream: String?
    /// The response head must be there by this instant (the route's `timeout`); a streamed
    /// body then flows under `streamIdleTimeout` and `maxStreamDuration` instead.
    public var deadline: ContinuousClock.Instant
    /// The longest silence between two chunks of a streamed body (the route's `stream_idle_timeout`).
    public var streamIdleTimeout: Duration = .seconds(60)
    /// The longest a streamed response may last in all (`max_stream_duration`); `nil`: no limit.
    public var maxStreamDuration: Duration?
    /// A logger with the request id and route attached as metadata. Made when asked for: most
    /// requests never log through it, and attaching metadata copies a dictionary.
    public var logger: Logger {
        get {
            var logger = baseLogger
            logger[metadataKey: "request_id"] = .string(requestID)
            if let route { logger[metadataKey: "route"] = .string(route) }
            return logger
        }
        set { baseLogger = newValue }
    }
    private var baseLogger: Logger
    public var clock: any GatewayClock
    /// Facts inner middleware record for outer ones (the access log, metrics).
    public let stats: RequestStats

    public init(requestID: String, route: String? = nil, upstream: String? = nil,
                deadline: ContinuousClock.Instant, logger: Logger, clock: any GatewayClock,
                stats: RequestStats = RequestStats()) {
        self.requestID = requestID
        self.route = route
        self.upstream = upstream
        self.deadline = deadline
        self.baseLogger = logger
        self.clock = clock
        self.stats = stats
    }

    /// Time left before the deadline (zero or negative when it has passed).
    public var remaining: Duration { clock.now.duration(to: deadline) }
}

/// Per-request facts written by inner middleware and read by outer ones once `next` returns.
/// Shared by reference because the context is a value passed down the chain.
public final class RequestStats: Sendable {
    public struct Values: Sendable {
        /// Time spent waiting on the upstream, summed over attempts.
        public var upstreamDuration: Duration = .zero
        /// Upstream attempts made (1 without retries).
        public var attempts: Int = 0
        /// Cache status for the access log (`hit`, `miss`, `stale`, …).
        public var cacheStatus: String?
        /// The credential injected, by name (never its value).
        public var credential: String?
        /// Free-form additions from middleware: shown in the access log.
        public var extra: [(String, String)] = []
        /// Facts a middleware keeps for itself or shares with another, by key type.
        private var facts: [ObjectIdentifier: any Sendable] = [:]

        /// The fact recorded under `key`, `nil` when none is.
        public subscript<Key: RequestStatsKey>(_ key: Key.Type) -> Key.Value? {
            get { facts[ObjectIdentifier(key)] as? Key.Value }
            set { facts[ObjectIdentifier(key)] = newValue }
        }

        /// The fact recorded under `key`, `defaultValue` when none is: lets a fact be changed in place.
        public subscript<Key: RequestStatsKey>(_ key: Key.Type, default defaultValue: @autoclosure () -> Key.Value) -> Key.Value {
            get { self[key] ?? defaultValue() }
            set { self[key] = newValue }
        }
    }

    private let values = Mutex(Values())

    public init() {}

    public var snapshot: Values { values.withLock { $0 } }

    public func update<Result>(_ body: (inout Values) -> Result) -> Result {
        values.withLock { body(&$0) }
    }
}

/// Names a fact in `RequestStats` and its type; the middleware that defines it owns it, so the
/// core need not know every middleware's types.
///
///     enum Notes: RequestStatsKey { typealias Value = [String] }
///     context.stats.update { $0[Notes.self, default: []].append("served from a replica") }
public protocol RequestStatsKey {
    associatedtype Value: Sendable
}
