import Foundation

/// `GET /upstreams`: each upstream and each of its endpoints as the gateway sees them now —
/// address, health, ejection (until when and why), requests in flight, last failure — and
/// whether all of an upstream's endpoints are down (attempts then spread over all of them).
public struct UpstreamReport: Sendable, Encodable {
    public struct Upstream: Sendable, Encodable {
        public var name: String
        public var transport: String
        public var balance: String
        /// No endpoint is up: attempts are spread over all of them.
        public var allDown: Bool
        public var circuitBreaker: Breaker?
        public var endpoints: [Endpoint]

        enum CodingKeys: String, CodingKey {
            case name, transport, balance, endpoints
            case allDown = "all_down"
            case circuitBreaker = "circuit_breaker"
        }
    }

    public struct Breaker: Sendable, Encodable {
        public var maxRequests: Int
        public var maxPending: Int
        public var inFlight: Int

        enum CodingKeys: String, CodingKey {
            case maxRequests = "max_requests"
            case maxPending = "max_pending"
            case inFlight = "in_flight"
        }
    }

    public struct Endpoint: Sendable, Encodable {
        public var address: String
        public var url: String
        /// `up`, `failing` (failing in a row, kept in rotation by the ejection cap), `ejected`, `unhealthy`.
        public var state: String
        /// The health check's verdict: `healthy`, `unhealthy`, `unknown` (none yet, or no checks).
        public var health: String
        /// RFC 3339, while ejected.
        public var ejectedUntil: String?
        /// The failure kind that ejected it, while ejected.
        public var ejectionReason: String?
        public var ejections: Int
        public var consecutiveFailures: Int
        /// `nil` for a single-endpoint upstream, which keeps no such count.
        public var inFlight: Int?
        public var lastFailure: Failure?

        enum CodingKeys: String, CodingKey {
            case address, url, state, health, ejections
            case ejectedUntil = "ejected_until"
            case ejectionReason = "ejection_reason"
            case consecutiveFailures = "consecutive_failures"
            case inFlight = "in_flight"
            case lastFailure = "last_failure"
        }
    }

    public struct Failure: Sendable, Encodable {
        public var kind: String
        /// RFC 3339.
        public var at: String
    }

    public var upstreams: [Upstream]

    public init(_ runtime: GatewayRuntime) {
        upstreams = runtime.upstreams.keys.sorted().compactMap { name in
            guard let client = runtime.upstreams[name] else { return nil }
            if let balanced = client as? BalancedUpstream { return balanced.report() }
            let config = client.config
            return Upstream(name: name, transport: config.transport.rawValue, balance: config.balance.rawValue,
                            allDown: false, circuitBreaker: nil, endpoints: [
                                Endpoint(address: UpstreamTarget(baseURL: config.url).authority, url: config.url.absoluteString,
                                         state: "up", health: EndpointState.Health.unknown.description, ejections: 0,
                                         consecutiveFailures: 0),
                            ])
        }
    }

    /// RFC 3339 in UTC (as the other admin reports).
    static func timestamp(_ date: Date) -> String {
        date.formatted(.iso8601)
    }
}

extension BalancedUpstream {
    /// This upstream's part of `GET /upstreams` (loads only).
    func report() -> UpstreamReport.Upstream {
        let nowInstant = clock.now
        let wallNow = clock.wallNow
        let now = offset(nowInstant)
        func wall(_ offset: Int64) -> String {
            UpstreamReport.timestamp(wallNow.addingTimeInterval(Double(offset - now) / 1e9))
        }
        let threshold = config.outlierDetection.consecutiveFailures
        var anyUp = false
        let set = currentSet()
        let endpoints = zip(set.endpoints, set.columns).map { endpoint, index in
            let ejected = endpoint.isEjected(at: now)
            let health = endpoint.currentHealth
            let failures = endpoint.consecutiveFailures.load(ordering: .relaxed)
            let state = if ejected { "ejected" } else if health == .unhealthy { "unhealthy" } else if failures >= threshold { "failing" } else { "up" }
            if state == "up" { anyUp = true }
            let lastKind = EndpointFailure(rawValue: endpoint.lastFailure.load(ordering: .relaxed))
            return UpstreamReport.Endpoint(
                address: endpoint.address, url: endpoint.url.absoluteString, state: state, health: health.description,
                ejectedUntil: ejected ? wall(endpoint.ejectedUntil.load(ordering: .relaxed)) : nil,
                ejectionReason: ejected ? EndpointFailure(rawValue: endpoint.ejectionReason.load(ordering: .relaxed))?.name : nil,
                ejections: endpoint.ejectionsTotal.load(ordering: .relaxed), consecutiveFailures: failures,
                inFlight: inFlight(index),
                lastFailure: lastKind.map { UpstreamReport.Failure(kind: $0.name, at: wall(endpoint.lastFailureAt.load(ordering: .relaxed))) })
        }
        return UpstreamReport.Upstream(
            name: config.name, transport: config.transport.rawValue, balance: config.balance.rawValue, allDown: !anyUp,
            circuitBreaker: config.circuitBreaker.map {
                UpstreamReport.Breaker(maxRequests: $0.maxRequests, maxPending: $0.maxPending, inFlight: breakerInFlight ?? 0)
            },
            endpoints: endpoints)
    }
}
