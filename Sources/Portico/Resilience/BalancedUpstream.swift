import Foundation
import HTTPTypes
import Logging
import LockAudit
import Metrics
import Synchronization

/// An upstream over several endpoints (issue #34): picks one per attempt, counts each
/// endpoint's failures against it alone, ejects one that keeps failing, and refuses at once what
/// the circuit breaker does not admit. Each endpoint has its own transport client — on `nio`, its
/// own per-loop connection pool.
///
/// **The request path.** A pick reads each endpoint's record (atomics written only when something
/// changes, `EndpointState`) and the calling loop's own row (`LoopSlots`: its in-flight count per
/// endpoint, its round-robin turn, its random state), which no other loop writes. A success on a
/// healthy endpoint writes nothing shared. The one word every loop writes is the breaker's
/// `SharedCap` (`upstreams.NAME.max_requests`), and only when `circuit_breaker` is configured.
///
/// **Failures** (`EndpointFailure`) are the endpoint's own: connect failures, resets, timeouts,
/// 502/503/504 (every 5xx with `failures: 5xx`); never a 4xx or the client leaving.
/// `consecutive_failures` of them in a row eject the endpoint for `base_ejection` × its ejections
/// in a row (at most `OutlierDetectionConfig.maxEjectionMultiplier` times); once that has passed it
/// takes traffic again on probation: one failure ejects it again at once, one success clears its
/// record. An ejection that would leave no endpoint available, or eject more than `max_ejection`
/// of them (rounded down), does not happen: such an endpoint stays in rotation, and counts as down.
///
/// **All down.** When no endpoint is up (each is ejected, failing its health check, or failing),
/// attempts are spread over all of them, and the first to answer well takes traffic again at
/// once (its ejection is lifted). `portico_upstream_all_endpoints_down_total` counts such attempts
/// and `/upstreams` says so.
///
/// **Retries** (the `retry` middleware calls again with the same request stats): an attempt avoids
/// the endpoint whose attempt just failed when another is available.
///
/// **The breaker** counts a request from its pick until its response head (or failure); past
/// `max_requests`, or past the endpoints' connections (`max_connections` each) plus
/// `max_pending`, the request is answered `503 upstream_overloaded` with `Retry-After` at once.
public final class BalancedUpstream: UpstreamClient {
    public let config: UpstreamConfig
    public let endpoints: [EndpointState]
    let clock: any GatewayClock
    /// The instant the endpoints' recorded times count from.
    let origin: ContinuousClock.Instant
    private let loops: EventLoops
    /// One per loop of `loops`, and one more for callers on none of them.
    private let rows: [LoopSlots]
    private let breaker: CircuitBreaker?
    private let metrics: BalancedUpstreamMetrics
    private let logger: Logger
    /// Taken to decide an ejection (on a failure past the threshold, never per request), so
    /// that two at once cannot both pass the cap.
    private let ejections = Mutex(())
    private let threshold: Int
    private let allMask: UInt64
    /// One per endpoint with `health_check`; cancelled at shutdown or when a successor takes over.
    private let checks = Mutex<[Task<Void, Never>]>([])
    /// Addresses of endpoints a successor took over at a reload.
    private let handedOver = Mutex<Set<String>>([])

    /// The breaker: one shared count, one limit (`min(max_requests, capacity + max_pending)`).
    private struct CircuitBreaker: Sendable {
        let inFlight: SharedCap
        let limit: Int
        let maxRequests: Int
        let maxPending: Int
        /// The limit is `max_pending`'s (more requests than the connections carry, waiting).
        let limitIsPending: Bool
    }

    /// Row layout: the in-flight count per endpoint, then the turn, then the random state.
    private var turnSlot: Int { endpoints.count }
    private var randomSlot: Int { endpoints.count + 1 }

    /// `previous`: the upstream of the same name this one replaces at a reload. Each endpoint of
    /// both, at the same address with the same transport settings, is taken over whole — its
    /// client (and pool) and its record (failures, ejection, health) — and `previous` no longer
    /// checks its health nor shuts its client down.
    init(config: UpstreamConfig, logger: Logger, loops: EventLoops, clock: any GatewayClock,
         metricsFactory: any MetricsFactory = MetricsSystem.factory, previous: BalancedUpstream? = nil,
         makeClient: (UpstreamConfig) -> any UpstreamClient) {
        precondition(!config.endpoints.isEmpty && config.endpoints.count <= UpstreamConfig.maxEndpoints)
        self.config = config
        self.clock = clock
        // Records taken over count their instants from the same origin.
        self.origin = previous?.origin ?? clock.now
        self.loops = loops
        self.logger = logger
        self.metrics = BalancedUpstreamMetrics(upstream: config.name, factory: metricsFactory)
        self.threshold = config.outlierDetection.consecutiveFailures
        let reusable = previous.map { previous in
            Dictionary(previous.endpoints.map { ($0.address, $0) }, uniquingKeysWith: { first, _ in first })
        } ?? [:]
        var takenOver: Set<String> = []
        self.endpoints = config.endpoints.map { url in
            let own = Self.endpointConfig(config, url: url)
            let address = UpstreamTarget(baseURL: url).authority
            if let kept = reusable[address], kept.config == own {
                takenOver.insert(address)
                return kept
            }
            return EndpointState(url: url, config: own, client: makeClient(own),
                                 metrics: EndpointMetrics(upstream: config.name, endpoint: address, factory: metricsFactory))
        }
        previous?.handOver(takenOver)
        let count = config.endpoints.count
        allMask = count == 64 ? .max : (UInt64(1) << UInt64(count)) - 1
        rows = (0...loops.count).map { _ in
            let row = LoopSlots(count: count + 2)
            row.store(count + 1, Int.random(in: 1...Int.max))
            return row
        }
        breaker = config.circuitBreaker.map { breaker in
            let capacity = count * max(1, config.maxConnections)
            let pendingLimit = capacity + breaker.maxPending
            return CircuitBreaker(inFlight: SharedCap(name: "upstreams.\(config.name).max_requests"),
                                  limit: min(breaker.maxRequests, pendingLimit), maxRequests: breaker.maxRequests,
                                  maxPending: breaker.maxPending, limitIsPending: pendingLimit < breaker.maxRequests)
        }
        if let healthCheck = config.healthCheck {
            let tasks = endpoints.map { endpoint in
                let check = EndpointHealthCheck(endpoint: endpoint, config: healthCheck, upstream: config.name,
                                                clock: clock, logger: logger)
                return Task { await check.run() }
            }
            checks.withLock { $0 = tasks }
        }
    }

    nonisolated(nonsending) public func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        if let breaker, !breaker.inFlight.tryAcquire(limit: breaker.limit) {
            throw refusal(breaker)
        }
        defer { breaker?.inFlight.release() }
        let row = rows[loops.currentIndex ?? loops.count]
        let now = offset(context.clock.now)
        let pick = context.stats.update { values in
            let pick = self.pick(now: now, avoiding: values[FailedEndpoint.self], row: row)
            values.recordEndpoint(endpoints[pick.index].address)
            return pick
        }
        let index = pick.index
        let endpoint = endpoints[index]
        if pick.allDown { metrics.allDown.increment() }
        endpoint.metrics.requests.increment()
        row.add(index, 1)
        defer { row.add(index, -1) }
        do {
            let response = try await endpoint.client.send(request, context: context)
            if let failure = EndpointFailure(status: response.status.code, policy: config.outlierDetection.failures) {
                failed(endpoint, failure, at: offset(context.clock.now))
                context.stats.update { $0[FailedEndpoint.self] = index }
            } else {
                succeeded(endpoint, at: offset(context.clock.now), allDown: pick.allDown)
            }
            return response
        } catch {
            if let failure = EndpointFailure(error: error) {
                failed(endpoint, failure, at: offset(context.clock.now))
                context.stats.update { $0[FailedEndpoint.self] = index }
            }
            throw error
        }
    }

    public func shutdown() async {
        await stopHealthChecks()
        let kept = handedOver.withLock { $0 }
        for endpoint in endpoints where !kept.contains(endpoint.address) {
            await endpoint.client.shutdown()
        }
    }

    private func stopHealthChecks() async {
        let tasks = checks.withLock { tasks in
            defer { tasks = [] }
            return tasks
        }
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
    }

    /// A successor took these endpoints over: their health is its to check, their clients its to
    /// shut down. This upstream only finishes the exchanges it has in flight.
    private func handOver(_ addresses: Set<String>) {
        handedOver.withLock { $0.formUnion(addresses) }
        let tasks = checks.withLock { tasks in
            defer { tasks = [] }
            return tasks
        }
        for task in tasks { task.cancel() }
    }

    /// One endpoint's transport settings: the upstream's, at `url`, without what only the
    /// balancer reads (so a change of those keeps the endpoint's client and record at a reload).
    static func endpointConfig(_ config: UpstreamConfig, url: URL) -> UpstreamConfig {
        var own = config
        own.url = url
        own.endpoints = [url]
        own.circuitBreaker = nil
        own.healthCheck = nil
        own.balance = .roundRobin
        own.outlierDetection = OutlierDetectionConfig()
        return own
    }

    /// Requests the breaker counts now (`nil` without one).
    var breakerInFlight: Int? { breaker.map { max(0, $0.inFlight.current) } }

    /// Requests in flight on endpoint `index`, over every loop (for reports: loads only).
    public func inFlight(_ index: Int) -> Int {
        max(0, rows.reduce(0) { $0 + $1.load(index) })
    }

    // MARK: Picking

    struct Pick {
        var index: Int
        /// No endpoint was available: this one was picked among all.
        var allDown: Bool
    }

    /// The endpoint for one attempt, by `config.balance`, among the usable ones (not ejected, not
    /// failing their health check) other than `avoiding` (the one whose attempt just failed) when
    /// there are any; among all when none is up (usable and not failing `consecutive_failures`
    /// times in a row: the cap may keep a failing endpoint in rotation).
    func pick(now: Int64, avoiding: Int?, row: LoopSlots) -> Pick {
        var mask: UInt64 = 0
        var up = false
        for (index, endpoint) in endpoints.enumerated() where endpoint.isUsable(at: now) {
            mask |= UInt64(1) << UInt64(index)
            if !up { up = endpoint.consecutiveFailures.load(ordering: .relaxed) < threshold }
        }
        let allDown = !up
        if allDown { mask = allMask }
        if let avoiding {
            let others = mask & ~(UInt64(1) << UInt64(avoiding))
            if others != 0 { mask = others }
        }
        let count = mask.nonzeroBitCount
        if count == 1 { return Pick(index: mask.trailingZeroBitCount, allDown: allDown) }
        let index: Int
        switch config.balance {
        case .roundRobin:
            let turn = row.load(turnSlot)
            row.store(turnSlot, turn &+ 1)
            index = Self.setBit(mask, number: Int(UInt(bitPattern: turn) % UInt(count)))
        case .random:
            index = Self.setBit(mask, number: random(below: count, row: row))
        case .leastRequest:
            // Power of two choices on this loop's own counts.
            let first = random(below: count, row: row)
            var second = random(below: count - 1, row: row)
            if second >= first { second += 1 }
            let a = Self.setBit(mask, number: first), b = Self.setBit(mask, number: second)
            index = row.load(b) < row.load(a) ? b : a
        }
        return Pick(index: index, allDown: allDown)
    }

    /// The index of the `number`th set bit of `mask` (counting from 0).
    static func setBit(_ mask: UInt64, number: Int) -> Int {
        var rest = mask
        for _ in 0..<number { rest &= rest - 1 }
        return rest.trailingZeroBitCount
    }

    /// Uniform in `0..<bound`, from the row's own xorshift state (no system call, no shared word).
    private func random(below bound: Int, row: LoopSlots) -> Int {
        var x = UInt64(bitPattern: Int64(row.load(randomSlot)))
        x ^= x << 13
        x ^= x >> 7
        x ^= x << 17
        row.store(randomSlot, Int(Int64(bitPattern: x)))
        return Int((x >> 11) % UInt64(bound))
    }

    // MARK: Outcomes

    private func failed(_ endpoint: EndpointState, _ kind: EndpointFailure, at now: Int64) {
        endpoint.metrics.failed(kind)
        endpoint.lastFailure.store(kind.rawValue, ordering: .relaxed)
        endpoint.lastFailureAt.store(now, ordering: .relaxed)
        // An exchange that began before the ejection: already dealt with.
        guard !endpoint.isEjected(at: now) else { return }
        let failures = endpoint.consecutiveFailures.wrappingAdd(1, ordering: .relaxed).newValue
        if failures >= threshold || endpoint.ejectionsInARow.load(ordering: .relaxed) > 0 {
            eject(endpoint, kind, at: now)
        }
    }

    private func succeeded(_ endpoint: EndpointState, at now: Int64, allDown: Bool) {
        // Loads first: a healthy endpoint's success writes nothing.
        if endpoint.consecutiveFailures.load(ordering: .relaxed) != 0 {
            endpoint.consecutiveFailures.store(0, ordering: .relaxed)
        }
        guard endpoint.ejectionsInARow.load(ordering: .relaxed) != 0 else { return }
        if endpoint.isEjected(at: now) {
            // Picked while all were down, and answered: it takes traffic again at once.
            guard allDown else { return }
            endpoint.ejectedUntil.store(0, ordering: .relaxed)
        }
        endpoint.ejectionsInARow.store(0, ordering: .relaxed)
        endpoint.metrics.ejected.record(0)
    }

    /// Ejects `endpoint` unless the cap forbids it (`max_ejection`, and never the last available one).
    private func eject(_ endpoint: EndpointState, _ kind: EndpointFailure, at now: Int64) {
        let outlier = config.outlierDetection
        let ejection: Duration? = ejections.withLock { _ in
            guard !endpoint.isEjected(at: now) else { return nil }
            var ejectedNow = 0, availableOthers = 0
            for other in endpoints {
                if other.isEjected(at: now) {
                    ejectedNow += 1
                } else if other !== endpoint && other.isUp(at: now, threshold: threshold) {
                    availableOthers += 1
                }
            }
            let allowed = Int((Double(endpoints.count) * outlier.maxEjection).rounded(.down))
            guard ejectedNow < allowed, availableOthers > 0 else { return nil }
            let times = min(endpoint.ejectionsInARow.load(ordering: .relaxed) + 1, OutlierDetectionConfig.maxEjectionMultiplier)
            let duration = outlier.baseEjection * times
            endpoint.ejectionsInARow.store(times, ordering: .relaxed)
            endpoint.ejectionReason.store(kind.rawValue, ordering: .relaxed)
            endpoint.consecutiveFailures.store(0, ordering: .relaxed)
            endpoint.ejectionsTotal.wrappingAdd(1, ordering: .relaxed)
            endpoint.ejectedUntil.store(now + Self.nanoseconds(duration), ordering: .relaxed)
            return duration
        }
        guard let ejection else { return }
        endpoint.metrics.ejections.increment()
        endpoint.metrics.ejected.record(1)
        logger.warning("upstream endpoint ejected", metadata: [
            "upstream": "\(config.name)", "endpoint": "\(endpoint.address)", "reason": "\(kind.name)",
            "duration": "\(ejection)",
        ])
    }

    private func refusal(_ breaker: CircuitBreaker) -> GatewayError {
        let limit: String
        if breaker.limitIsPending {
            metrics.refusedMaxPending.increment()
            limit = "more than \(breaker.maxPending) requests waiting for a connection (max_pending)"
        } else {
            metrics.refusedMaxRequests.increment()
            limit = "\(breaker.maxRequests) requests in flight (max_requests)"
        }
        var fields = HTTPFields()
        fields[.retryAfter] = "1"
        return GatewayError(.upstreamOverloaded, message: "upstream \(config.name) has \(limit); retry later",
                            headerFields: fields)
    }

    // MARK: Time

    /// Nanoseconds from `origin` to `instant`.
    func offset(_ instant: ContinuousClock.Instant) -> Int64 {
        Self.nanoseconds(origin.duration(to: instant))
    }

    static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    func instant(_ offset: Int64) -> ContinuousClock.Instant {
        origin.advanced(by: .nanoseconds(offset))
    }
}

/// The endpoint whose attempt at this request just failed (by index in its upstream): the next
/// attempt avoids it.
enum FailedEndpoint: RequestStatsKey {
    typealias Value = Int
}

extension RequestStats.Values {
    /// The access log's `endpoint`: the last attempt's.
    mutating func recordEndpoint(_ address: String) {
        if let index = extra.firstIndex(where: { $0.0 == "endpoint" }) {
            extra[index].1 = address
        } else {
            extra.append(("endpoint", address))
        }
    }
}
