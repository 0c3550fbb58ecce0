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
/// A resolved upstream (`dns_refresh`) reads its endpoint set from its loop's own slot (a lock
/// only that loop takes per request; a changed answer writes every slot once).
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
/// **The breaker** counts a request from its pick until its response is over (its head, or the
/// end of a streamed body) or fails; past
/// `max_requests`, or past the endpoints' connections (`max_connections` each) plus
/// `max_pending`, the request is answered `503 upstream_overloaded` with `Retry-After` at once.
public final class BalancedUpstream: UpstreamClient {
    public let config: UpstreamConfig
    /// The endpoints now (a resolved upstream's change as its name's addresses do).
    public var endpoints: [EndpointState] { currentSet().endpoints }
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
    /// A row's width: a column per endpoint (in flight), then the turn, then the random state.
    private let rowWidth: Int
    /// The endpoints of an upstream whose endpoints are configured (`nil` when resolved).
    private let fixed: EndpointSet?
    /// A resolved upstream's endpoints: one slot per row, all written at each change of the
    /// name's addresses (rarely), each read per request by its own loop.
    private let resolved: [SetSlot]
    private let resolution: Resolution?
    /// One per endpoint with `health_check`, by address; cancelled at shutdown, when the endpoint
    /// goes, or when a successor takes over.
    private let checks = Mutex<[String: Task<Void, Never>]>([:])
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

    private var turnSlot: Int { rowWidth - 2 }
    private var randomSlot: Int { rowWidth - 1 }

    /// Endpoints and their columns in the loops' rows (a column stays an endpoint's while it is
    /// in a set or draining).
    final class EndpointSet: Sendable {
        let endpoints: [EndpointState]
        let columns: [Int]
        let allMask: UInt64

        init(_ endpoints: [EndpointState], columns: [Int]) {
            self.endpoints = endpoints
            self.columns = columns
            allMask = endpoints.count == 64 ? .max : (UInt64(1) << UInt64(endpoints.count)) - 1
        }
    }

    /// `dns_refresh`: the name, its resolver, and the endpoints it no longer lists.
    private final class Resolution: Sendable {
        let host: String
        let refresh: Duration
        let resolver: any EndpointResolver
        let makeClient: @Sendable (UpstreamConfig) -> any UpstreamClient
        let metricsFactory: any MetricsFactory
        struct State {
            /// Removed endpoints, oldest first: their exchanges in flight finish on them; at most
            /// `maxDraining` are kept (the oldest beyond are shut down).
            var draining: [(endpoint: EndpointState, column: Int)] = []
            var task: Task<Void, Never>?
        }
        let state = Mutex(State())

        init(host: String, refresh: Duration, resolver: any EndpointResolver, metricsFactory: any MetricsFactory,
             makeClient: @escaping @Sendable (UpstreamConfig) -> any UpstreamClient) {
            self.host = host
            self.refresh = refresh
            self.resolver = resolver
            self.metricsFactory = metricsFactory
            self.makeClient = makeClient
        }
    }

    static let maxDraining = UpstreamConfig.maxEndpoints

    /// One row's view of a resolved upstream's endpoints.
    private final class SetSlot: Sendable {
        let set: Mutex<EndpointSet>
        init(_ set: EndpointSet) { self.set = Mutex(set) }
    }

    /// The set a request on row `row` sees (the fixed one: no lock).
    @inline(__always)
    func currentSet(_ row: Int? = nil) -> EndpointSet {
        if let fixed { return fixed }
        return resolved[row ?? loops.count].set.withLock { $0 }
    }

    /// `previous`: the upstream of the same name this one replaces at a reload. Each endpoint of
    /// both, at the same address with the same transport settings, is taken over whole — its
    /// client (and pool) and its record (failures, ejection, health) — and `previous` no longer
    /// checks its health nor shuts its client down.
    init(config: UpstreamConfig, logger: Logger, loops: EventLoops, clock: any GatewayClock,
         metricsFactory: any MetricsFactory = MetricsSystem.factory, previous: BalancedUpstream? = nil,
         resolver: any EndpointResolver = SystemResolver(),
         makeClient: @escaping @Sendable (UpstreamConfig) -> any UpstreamClient) {
        precondition(!config.endpoints.isEmpty && config.endpoints.count <= UpstreamConfig.maxEndpoints)
        self.config = config
        self.clock = clock
        // Records taken over count their instants from the same origin.
        self.origin = previous?.origin ?? clock.now
        self.loops = loops
        self.logger = logger
        self.metrics = BalancedUpstreamMetrics(upstream: config.name, factory: metricsFactory)
        self.threshold = config.outlierDetection.consecutiveFailures
        var initial: [EndpointState]
        if let refresh = config.dnsRefresh, let host = config.url.host {
            // Until the first answer: the name itself, resolved by the transport per connection.
            let own = Self.endpointConfig(config, url: config.url)
            initial = [EndpointState(url: config.url, config: own, client: makeClient(own),
                                     metrics: EndpointMetrics(upstream: config.name, endpoint: UpstreamTarget(baseURL: config.url).authority,
                                                              factory: metricsFactory))]
            resolution = Resolution(host: host, refresh: refresh, resolver: resolver, metricsFactory: metricsFactory,
                                    makeClient: makeClient)
            rowWidth = UpstreamConfig.maxEndpoints + Self.maxDraining + 2
        } else {
            let reusable = previous.map { previous in
                Dictionary(previous.endpoints.map { ($0.address, $0) }, uniquingKeysWith: { first, _ in first })
            } ?? [:]
            var takenOver: Set<String> = []
            initial = config.endpoints.map { url in
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
            resolution = nil
            rowWidth = config.endpoints.count + 2
        }
        let set = EndpointSet(initial, columns: Array(initial.indices))
        if resolution == nil {
            fixed = set
            resolved = []
        } else {
            fixed = nil
            resolved = (0...loops.count).map { _ in SetSlot(set) }
        }
        let count = config.endpoints.count
        let width = rowWidth
        rows = (0...loops.count).map { _ in
            let row = LoopSlots(count: width)
            row.store(width - 1, Int.random(in: 1...Int.max))
            return row
        }
        breaker = config.circuitBreaker.map { breaker in
            // A resolved upstream counts the connections of one endpoint (its count changes).
            let capacity = count * max(1, config.maxConnections)
            let pendingLimit = capacity + breaker.maxPending
            return CircuitBreaker(inFlight: SharedCap(name: "upstreams.\(config.name).max_requests"),
                                  limit: min(breaker.maxRequests, pendingLimit), maxRequests: breaker.maxRequests,
                                  maxPending: breaker.maxPending, limitIsPending: pendingLimit < breaker.maxRequests)
        }
        startHealthChecks(initial)
        if let resolution {
            let task = Task { await self.keepResolving() }
            resolution.state.withLock { $0.task = task }
        }
    }

    private func startHealthChecks(_ endpoints: [EndpointState]) {
        guard let healthCheck = config.healthCheck else { return }
        for endpoint in endpoints {
            let check = EndpointHealthCheck(endpoint: endpoint, config: healthCheck, upstream: config.name,
                                            clock: clock, logger: logger)
            let task = Task { await check.run() }
            checks.withLock { $0[endpoint.address]?.cancel(); $0[endpoint.address] = task }
        }
    }

    nonisolated(nonsending) public func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        if let breaker, !breaker.inFlight.tryAcquire(limit: breaker.limit) {
            throw refusal(breaker)
        }
        // Until the exchange is over: at the response head, or for a streamed body when it ends
        // (`followStream`, which then takes these over).
        var streaming = false
        defer { if !streaming { breaker?.inFlight.release() } }
        let rowIndex = loops.currentIndex ?? loops.count
        let row = rows[rowIndex]
        let set = currentSet(rowIndex)
        let now = offset(context.clock.now)
        let pick = context.stats.update { values in
            let pick = self.pick(now: now, avoiding: values[FailedEndpoint.self], row: row, set: set)
            values.recordEndpoint(set.endpoints[pick.index].address)
            return pick
        }
        let endpoint = set.endpoints[pick.index]
        let index = set.columns[pick.index]
        // A lone endpoint without a breaker has nothing to follow a streamed body for.
        let followsStreams = breaker != nil || set.endpoints.count > 1
        if pick.allDown { metrics.allDown.increment() }
        endpoint.metrics.requests.increment()
        row.add(index, 1)
        defer { if !streaming { row.add(index, -1) } }
        do {
            var response = try await endpoint.client.send(request, context: context)
            let failure = EndpointFailure(status: response.status.code, policy: config.outlierDetection.failures)
            let follow = followsStreams && response.body.isStreamed
            if let failure {
                failed(endpoint, failure, at: offset(context.clock.now))
                context.stats.update { $0[FailedEndpoint.self] = index }
            } else if !follow {
                succeeded(endpoint, at: offset(context.clock.now), allDown: pick.allDown)
            }
            if follow {
                streaming = true
                followStream(&response.body, endpoint: endpoint, row: row, rowIndex: rowIndex, column: index,
                             clock: context.clock, success: failure == nil ? pick.allDown : nil)
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

    /// A streamed response is in flight until its body ends, not at its head: the breaker's
    /// count and the loop's in-flight count for `least_request` are given back then, and an
    /// upstream that resets or closes short mid-body counts against its endpoint (`reset`).
    /// Whether a good head was a success is known only then too: `success` (the pick's
    /// `allDown`, or nil when the head already failed) is recorded when the body ends whole.
    /// The body's end comes on its reader's thread (the daemon thread paired with the loop):
    /// the loop's own row is written back on the loop, so no other thread writes it.
    private func followStream(_ body: inout Body, endpoint: EndpointState, row: LoopSlots, rowIndex: Int, column: Int,
                              clock: any GatewayClock, success allDown: Bool?) {
        let breaker = breaker
        let loop = rowIndex < loops.count ? loops.loops[rowIndex] : nil
        body.append(StreamObserver(clock: clock, onEnd: { [self] observation in
            breaker?.inFlight.release()
            if let loop, !loop.inEventLoop {
                loop.execute { row.add(column, -1) }
            } else {
                row.add(column, -1)
            }
            switch observation.ending {
            case .complete: if let allDown { succeeded(endpoint, at: offset(clock.now), allDown: allDown) }
            case .upstreamReset: failed(endpoint, .reset, at: offset(clock.now))
            // A stream's timeouts are the gateway's limits (max_stream_duration, the request's
            // deadline) as often as an upstream stalling: not counted.
            case .clientGone, .tooLarge, .timeout: break
            }
        }), keepsLength: true)
    }

    public func shutdown() async {
        await release { await $0.shutdown() }
    }

    /// A reload replaced this upstream: health checks and re-resolution stop now, and each
    /// endpoint's client lets its exchanges in flight finish (`UpstreamClient.retire`).
    public func retire() async {
        await release { await $0.retire() }
    }

    private func release(_ releasing: (any UpstreamClient) async -> Void) async {
        var draining: [EndpointState] = []
        if let resolution {
            let task = resolution.state.withLock { state in
                defer { state.task = nil }
                return state.task
            }
            task?.cancel()
            await task?.value
            draining = resolution.state.withLock { state in
                defer { state.draining = [] }
                return state.draining.map(\.endpoint)
            }
        }
        await stopHealthChecks()
        let kept = handedOver.withLock { $0 }
        for endpoint in endpoints + draining where !kept.contains(endpoint.address) {
            await releasing(endpoint.client)
        }
    }

    private func stopHealthChecks() async {
        let tasks = checks.withLock { tasks in
            defer { tasks = [:] }
            return Array(tasks.values)
        }
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
    }

    /// A successor took these endpoints over: their health is its to check, their clients its to
    /// shut down. This upstream only finishes the exchanges it has in flight.
    private func handOver(_ addresses: Set<String>) {
        handedOver.withLock { $0.formUnion(addresses) }
        let tasks = checks.withLock { tasks in
            defer { tasks = [:] }
            return Array(tasks.values)
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

    /// Requests in flight on the endpoint of `column` (its index, for configured endpoints), over
    /// every loop (for reports: loads only).
    public func inFlight(_ index: Int) -> Int {
        max(0, rows.reduce(0) { $0 + $1.load(index) })
    }

    // MARK: Picking

    struct Pick {
        var index: Int
        /// No endpoint was up: this one was picked among all.
        var allDown: Bool
    }

    /// The endpoint for one attempt, by `config.balance`, among the usable ones (not ejected, not
    /// failing their health check) other than `avoiding` (the one whose attempt just failed) when
    /// there are any; among all when none is up (usable and not failing `consecutive_failures`
    /// times in a row: the cap may keep a failing endpoint in rotation).
    func pick(now: Int64, avoiding avoidedColumn: Int?, row: LoopSlots, set: EndpointSet) -> Pick {
        let endpoints = set.endpoints
        var mask: UInt64 = 0
        var up = false
        for (index, endpoint) in endpoints.enumerated() where endpoint.isUsable(at: now) {
            mask |= UInt64(1) << UInt64(index)
            if !up { up = endpoint.consecutiveFailures.load(ordering: .relaxed) < threshold }
        }
        let allDown = !up
        if allDown { mask = set.allMask }
        if let avoidedColumn, let avoiding = set.columns.firstIndex(of: avoidedColumn) {
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
            index = row.load(set.columns[b]) < row.load(set.columns[a]) ? b : a
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
        let endpoints = self.endpoints
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

    // MARK: Resolving (`dns_refresh`)

    /// Resolves the name now and then every `dns_refresh` on the injected clock, until cancelled.
    private func keepResolving() async {
        guard let resolution else { return }
        while !Task.isCancelled {
            await refreshEndpoints()
            do {
                try await clock.sleep(for: resolution.refresh)
            } catch {
                return
            }
        }
    }

    /// One resolution: a changed answer changes the endpoints (new ones take traffic at once,
    /// removed ones drain); a failed or empty one keeps the last good set.
    func refreshEndpoints() async {
        guard let resolution else { return }
        let addresses: [String]
        do {
            addresses = try await resolution.resolver.resolve(resolution.host)
        } catch {
            logger.warning("upstream name not resolved: keeping its endpoints", metadata: [
                "upstream": "\(config.name)", "host": "\(resolution.host)", "error": "\(error)",
            ])
            return
        }
        guard !addresses.isEmpty else {
            logger.warning("upstream name resolved to no address: keeping its endpoints", metadata: [
                "upstream": "\(config.name)", "host": "\(resolution.host)",
            ])
            return
        }
        apply(addresses, resolution)
    }

    private func apply(_ addresses: [String], _ resolution: Resolution) {
        let target = UpstreamTarget(baseURL: config.url)
        let scheme = config.url.scheme?.lowercased() ?? "http"
        let port = config.url.port ?? (scheme == "https" ? 443 : 80)
        var wanted: [(address: String, url: URL)] = []
        for ip in addresses.prefix(UpstreamConfig.maxEndpoints) {
            let host = ip.contains(":") ? "[\(ip)]" : ip
            guard let url = URL(string: "\(scheme)://\(host):\(port)\(target.basePath)") else { continue }
            wanted.append((UpstreamTarget(baseURL: url).authority, url))
        }
        let (added, removed, evicted) = resolution.state.withLock { state -> ([EndpointState], [EndpointState], [EndpointState]) in
            let current = currentSet()
            if current.endpoints.map(\.address) == wanted.map(\.address) { return ([], [], []) }
            var kept: [String: (EndpointState, Int)] = [:]
            for (endpoint, column) in zip(current.endpoints, current.columns) { kept[endpoint.address] = (endpoint, column) }
            let stay = Set(wanted.map(\.address))
            var removed: [EndpointState] = []
            for (endpoint, column) in zip(current.endpoints, current.columns) where !stay.contains(endpoint.address) {
                state.draining.append((endpoint, column))
                removed.append(endpoint)
            }
            var evicted: [EndpointState] = []
            while state.draining.count > Self.maxDraining {
                evicted.append(state.draining.removeFirst().endpoint)
            }
            var used = Set(state.draining.map(\.column))
            for (address, entry) in kept where stay.contains(address) { used.insert(entry.1) }
            var endpoints: [EndpointState] = [], columns: [Int] = [], added: [EndpointState] = []
            for (address, url) in wanted {
                if let (endpoint, column) = kept[address] {
                    endpoints.append(endpoint)
                    columns.append(column)
                    continue
                }
                guard let column = (0..<(rowWidth - 2)).first(where: { !used.contains($0) }) else { continue }
                used.insert(column)
                var own = Self.endpointConfig(config, url: url)
                // The upstream still hears its name: `Host`, and TLS checks the certificate for it.
                own.requestAuthority = target.authority
                if scheme == "https", own.tls.serverName == nil { own.tls.serverName = resolution.host }
                let endpoint = EndpointState(url: url, config: own, client: resolution.makeClient(own),
                                             metrics: EndpointMetrics(upstream: config.name, endpoint: address,
                                                                      factory: resolution.metricsFactory))
                endpoints.append(endpoint)
                columns.append(column)
                added.append(endpoint)
            }
            let set = EndpointSet(endpoints, columns: columns)
            for slot in resolved { slot.set.withLock { $0 = set } }
            return (added, removed, evicted)
        }
        guard !added.isEmpty || !removed.isEmpty else { return }
        logger.info("upstream endpoints changed", metadata: [
            "upstream": "\(config.name)", "added": "\(added.map { $0.address })", "removed": "\(removed.map { $0.address })",
        ])
        let gone = checks.withLock { checks in removed.compactMap { checks.removeValue(forKey: $0.address) } }
        for task in gone { task.cancel() }
        startHealthChecks(added)
        if !evicted.isEmpty {
            Task { for endpoint in evicted { await endpoint.client.shutdown() } }
        }
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
