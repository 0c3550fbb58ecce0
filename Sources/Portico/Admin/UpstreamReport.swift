import Foundation
import Metrics

/// `GET /upstreams`: each upstream and each of its endpoints as the gateway sees them now —
/// address, health, ejection (until when and why), requests in flight, last failure — and
/// whether all of an upstream's endpoints are down (attempts then spread over all of them).
public struct UpstreamReport: Sendable, Encodable {
    public struct Upstream: Sendable, Encodable {
        public var name: String
        public var transport: String
        /// `protocol:` — `http1`, `http2` or `auto` — and, on `nio`, what requests go out on now
        /// (`h2`, or `http/1.1` once `auto` found no h2): set for every upstream by `UpstreamReport.init`.
        public var httpProtocol: String = UpstreamProtocol.http1.rawValue
        public var spoken: String?
        public var balance: String
        /// No endpoint is up: attempts are spread over all of them.
        public var allDown: Bool
        public var circuitBreaker: Breaker?
        /// `concurrency: adaptive`'s limit now; `nil` without.
        public var adaptiveConcurrency: Adaptive? = nil
        public var endpoints: [Endpoint]

        enum CodingKeys: String, CodingKey {
            case name, transport, balance, endpoints, spoken
            case httpProtocol = "protocol"
            case allDown = "all_down"
            case circuitBreaker = "circuit_breaker"
            case adaptiveConcurrency = "adaptive_concurrency"
        }
    }

    public struct Adaptive: Sendable, Encodable {
        public var limit: Int
        public var min: Int
        public var max: Int
        /// The fastest answer the limit measures against, in milliseconds (`nil` before any).
        public var minLatencyMs: Double?
        public var inFlight: Int

        enum CodingKeys: String, CodingKey {
            case limit, min, max
            case minLatencyMs = "min_latency_ms"
            case inFlight = "in_flight"
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
        /// The endpoint's `EndpointStatus`, by its word: `up`, `failing` (failing in a row, kept in
        /// rotation by the ejection cap), `ejected`, `probation` (back after an ejection),
        /// `unhealthy`.
        public var state: String
        /// The health check's verdict: `healthy`, `unhealthy`, `unknown` (none yet, or no checks).
        public var health: String
        /// RFC 3339, while ejected (the status's `until`).
        public var ejectedUntil: String?
        /// The failure kind that ejected it, while ejected (the status's `reason`).
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
            var report = Self.report(name, client)
            report?.httpProtocol = client.config.httpProtocol.rawValue
            report?.spoken = (client as? NIOUpstream)?.spokenProtocol
            return report
        }
    }

    private static func report(_ name: String, _ client: any UpstreamClient) -> Upstream? {
        if let balanced = client as? BalancedUpstream { return balanced.report() }
        let config = client.config
        return Upstream(name: name, transport: config.transport.rawValue, balance: config.balance.rawValue,
                        allDown: false, circuitBreaker: nil, endpoints: [
                            Endpoint(address: UpstreamTarget(baseURL: config.url).authority, url: config.url.absoluteString,
                                     state: EndpointStatus.up.name, health: EndpointState.Health.unknown.description, ejections: 0,
                                     consecutiveFailures: 0),
                        ])
    }

    /// `portico_upstream_http2_streams{upstream}`: the streams open now on each upstream with
    /// `protocol: http2 | auto`, summed over its loops and, on a balanced upstream, its
    /// endpoints, as `/metrics` is read.
    static func recordHTTP2Gauges(_ runtime: GatewayRuntime) async {
        for (name, client) in runtime.upstreams {
            let clients = (client as? BalancedUpstream)?.endpoints.map(\.client) ?? [client]
            var streams: Int?
            for case let upstream as NIOUpstream in clients {
                guard let snapshot = await upstream.http2Snapshot() else { continue }
                streams = (streams ?? 0) + snapshot.streams
            }
            guard let streams else { continue }
            Gauge(label: "portico_upstream_http2_streams", dimensions: [("upstream", name)]).record(streams)
        }
    }

    /// RFC 3339 in UTC (as the other admin reports).
    static func timestamp(_ date: Date) -> String {
        date.formatted(.iso8601)
    }
}

extension UpstreamReport.Endpoint {
    /// One endpoint as `status` says: its word is `state`, and an ejection's instant and reason are
    /// `ejected_until` and `ejection_reason`. Nothing here works out what the endpoint is.
    init(_ endpoint: EndpointState, status: EndpointStatus, failuresInARow: Int, ejections: Int, inFlight: Int?,
         lastFailure: (kind: EndpointFailure, at: ContinuousClock.Instant)?, wall: (ContinuousClock.Instant) -> String) {
        var until: String?, reason: String?
        if case .ejected(let instant, let why) = status {
            until = wall(instant)
            reason = why.name
        }
        self.init(address: endpoint.address, url: endpoint.url.absoluteString, state: status.name,
                  health: endpoint.currentHealth.description, ejectedUntil: until, ejectionReason: reason,
                  ejections: ejections, consecutiveFailures: failuresInARow, inFlight: inFlight,
                  lastFailure: lastFailure.map { UpstreamReport.Failure(kind: $0.kind.name, at: wall($0.at)) })
    }
}

extension BalancedUpstream {
    /// This upstream's part of `GET /upstreams` (loads only): each endpoint's status as the
    /// outlier detector says.
    func report() -> UpstreamReport.Upstream {
        let nowInstant = clock.now
        let wallNow = clock.wallNow
        func wall(_ instant: ContinuousClock.Instant) -> String {
            UpstreamReport.timestamp(wallNow.addingTimeInterval(nowInstant.duration(to: instant).secondsValue))
        }
        let now = outlier.moment(nowInstant)
        let set = currentSet()
        let statuses = set.endpoints.map { outlier.status(of: $0, at: now) }
        let endpoints = zip(set.endpoints, zip(set.columns, statuses)).map { endpoint, entry in
            UpstreamReport.Endpoint(endpoint, status: entry.1, failuresInARow: endpoint.outlier.failuresInARow,
                                    ejections: endpoint.outlier.ejections, inFlight: inFlight(entry.0),
                                    lastFailure: outlier.lastFailure(of: endpoint), wall: wall)
        }
        return UpstreamReport.Upstream(
            name: config.name, transport: config.transport.rawValue, balance: config.balance.rawValue,
            allDown: !statuses.contains { $0.isUp },
            circuitBreaker: breaker.map {
                UpstreamReport.Breaker(maxRequests: $0.maxRequests, maxPending: $0.maxPending, inFlight: $0.current)
            },
            adaptiveConcurrency: adaptive.map {
                UpstreamReport.Adaptive(limit: $0.limit, min: $0.config.min, max: $0.config.max,
                                        minLatencyMs: $0.minLatency.map { ($0.secondsValue * 1e6).rounded() / 1e3 }, inFlight: $0.current)
            },
            endpoints: endpoints)
    }
}
