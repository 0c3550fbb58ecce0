/// `upstreams.NAME.balance` is a `BalanceStrategy` (`BalancingPolicy.swift`, one file per policy).

/// `upstreams.NAME.outlier_detection`: ejecting an endpoint that keeps failing.
public struct OutlierDetectionConfig: Sendable, Equatable {
    /// Which answers count as the endpoint's failure besides connect failures, resets and timeouts.
    public enum Failures: String, Sendable, Equatable, CaseIterable {
        /// 502, 503 and 504 only.
        case gateway
        /// Every 5xx.
        case serverErrors = "5xx"
    }

    /// Failures in a row (no success between) that eject an endpoint.
    public var consecutiveFailures: Int = 5
    /// An ejection lasts this long times the endpoint's ejections in a row.
    public var baseEjection: Duration = .seconds(30)
    /// The share of the endpoints that may be ejected at once (0…1). Never the last one that is
    /// not ejected and not failing its health check, however it rounds.
    public var maxEjection: Double = 0.5
    public var failures: Failures = .gateway

    /// Ejections in a row multiply `baseEjection` up to this many times.
    public static let maxEjectionMultiplier = 10

    public init() {}
}

/// `upstreams.NAME.circuit_breaker`: immediate `503 upstream_overloaded` past these.
public struct CircuitBreakerConfig: Sendable, Equatable {
    /// Requests in flight to the upstream (all endpoints, all threads: one `SharedCap`).
    public var maxRequests: Int = 1024
    /// Requests waiting for a connection: those in flight beyond what the endpoints' connections
    /// (`max_connections` each) can carry at once.
    public var maxPending: Int = 1024

    public init() {}
}

/// `upstreams.NAME.health_check`: a request to each endpoint every `interval`, whatever the
/// traffic, off the request path (never counted as a request).
public struct HealthCheckConfig: Sendable, Equatable {
    /// The path requested (`GET`), with the upstream's base path before it.
    public var path: String
    public var interval: Duration = .seconds(5)
    /// A check not answered within this fails.
    public var timeout: Duration = .seconds(1)
    /// Passes in a row that make an endpoint healthy again.
    public var healthy: Int = 2
    /// Failures in a row that make it unhealthy (it then gets no traffic).
    public var unhealthy: Int = 3
    /// Statuses that pass.
    public var expect: ClosedRange<Int> = 200...399

    public init(path: String) {
        self.path = path
    }
}

/// `upstreams.NAME.adaptive_concurrency` (with `concurrency: adaptive`): a limit on the upstream's
/// requests in flight that follows its latency (`AdaptiveLimit`), between `min` and `max`.
public struct AdaptiveConcurrencyConfig: Sendable, Equatable {
    /// What latency the limit aims at.
    public enum Target: Sendable, Equatable {
        /// The lowest latency seen lately, times this factor (`min_rtt × 1.5`).
        case minimumTimes(Double)
        /// A fixed latency (`200ms`).
        case fixed(Duration)
    }

    public var min: Int = 4
    public var max: Int = 1000
    /// How often the limit is worked out again, from the answers of that time.
    public var sampleWindow: Duration = .milliseconds(250)
    public var target: Target = .minimumTimes(1.5)

    /// The limit a new upstream starts at: `min`, where nothing queues at the upstream, so the
    /// first windows measure its true minimum latency (a start above its capacity would measure a
    /// queue and aim too high for good); it climbs by √limit a window from there.
    public var initial: Int { min }

    public init() {}
}
