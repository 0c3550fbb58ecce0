import Foundation
import HTTPTypes
import Logging
import Metrics
import Synchronization

/// An upstream over several endpoints (issue #34): the composition of parts that each own one job.
///
/// - **Picking** (here): per attempt, among the endpoints whose `EndpointStatus` takes traffic,
///   by the configured `BalancingPolicy` (`balance`: one file per policy).
/// - **`OutlierDetector`**: counts each endpoint's failures against it alone, ejects one that keeps
///   failing, puts it on probation afterwards, and says what each endpoint is now
///   (`EndpointStatus`), which picking, `GET /upstreams`, metrics and `explain` read.
/// - **`CircuitBreaker`**: refuses at once (`503 upstream_overloaded`) past its limits.
/// - **`AdaptiveConcurrency`** (`concurrency: adaptive`): the same refusal past a limit that
///   follows the upstream's latency; fed each attempt's latency.
/// - **`HealthChecks`**: one active check per endpoint, off the request path.
/// - **`EndpointResolution`**: the endpoints a name resolves to (`dns_refresh`).
/// - **Following streams** (here): a streamed response is in flight, and judged, at its end.
/// - **Reload hand-over** (here): a successor takes unchanged endpoints over whole.
///
/// Each endpoint has its own transport client — on `nio`, its own per-loop connection pool.
///
/// **The request path.** A pick loads each endpoint's status (`EndpointState`'s records: atomics
/// written only when something changes) and reads and writes the calling loop's own row
/// (`LoopSlots`: its in-flight count per endpoint, the policy's words, its random state), which no
/// other loop writes. A success on an endpoint that is up writes nothing shared (`ewma` writes its
/// latency into the loop's own row). The words every loop writes are the breaker's `SharedCap`
/// (`upstreams.NAME.max_requests`), only when `circuit_breaker` is configured, and the adaptive
/// limit's (`upstreams.NAME.concurrency`), only with `concurrency: adaptive`. A resolved upstream (`dns_refresh`) reads its endpoint set
/// from its loop's own slot (a lock only that loop takes per request; a changed answer writes
/// every slot once).
///
/// **Failures** (`EndpointFailure`) are the endpoint's own: connect failures, resets, timeouts,
/// 502/503/504 (every 5xx with `failures: 5xx`); never a 4xx or the client leaving.
///
/// **All down.** When no endpoint is up (each is ejected, unhealthy, or failing), attempts are
/// spread over all of them, and the first to answer well takes traffic again at once (its
/// ejection is lifted). `portico_upstream_all_endpoints_down_total` counts such attempts and
/// `/upstreams` says so.
///
/// **Retries** (the `retry` middleware calls again with the same request stats): an attempt avoids
/// the endpoint whose attempt just failed when another is available.
public final class BalancedUpstream: UpstreamClient {
    public let config: UpstreamConfig
    /// The endpoints now (a resolved upstream's change as its name's addresses do).
    public var endpoints: [EndpointState] { currentSet().endpoints }
    let clock: any GatewayClock
    let outlier: OutlierDetector
    let breaker: CircuitBreaker?
    let adaptive: AdaptiveConcurrency?
    private let policy: any BalancingPolicy
    private let healthChecks: HealthChecks
    private let source: Source
    private let loops: EventLoops
    /// One per loop of `loops`, and one more for callers on none of them.
    private let rows: [LoopSlots]
    private let layout: RowLayout
    private let metrics: BalancedUpstreamMetrics
    /// Addresses of endpoints a successor took over at a reload.
    private let handedOver = Mutex<Set<String>>([])

    /// Where the endpoints come from.
    private enum Source: Sendable {
        /// `url:` or `endpoints:`: one set for good.
        case fixed(EndpointSet)
        /// `dns_refresh`: the name's addresses now.
        case resolved(EndpointResolution)
    }

    /// The set a request on row `row` sees (the fixed one: no lock).
    @inline(__always)
    func currentSet(_ row: Int? = nil) -> EndpointSet {
        switch source {
        case .fixed(let set): set
        case .resolved(let resolution): resolution.set(row: row ?? loops.count)
        }
    }

    /// `previous`: the upstream of the same name this one replaces at a reload. Each endpoint of
    /// both, at the same address with the same transport settings, is taken over whole — its
    /// client (and pool) and its records (failures, ejection, health) — and `previous` no longer
    /// checks its health nor shuts its client down.
    init(config: UpstreamConfig, logger: Logger, loops: EventLoops, clock: any GatewayClock,
         metricsFactory: any MetricsFactory = MetricsSystem.factory, previous: BalancedUpstream? = nil,
         resolver: any EndpointResolver = SystemResolver(),
         makeClient: @escaping @Sendable (UpstreamConfig) -> any UpstreamClient) {
        precondition(!config.endpoints.isEmpty && config.endpoints.count <= UpstreamConfig.maxEndpoints)
        self.config = config
        self.clock = clock
        self.loops = loops
        metrics = BalancedUpstreamMetrics(upstream: config.name, factory: metricsFactory)
        // Records taken over count their instants from the same origin.
        outlier = OutlierDetector(config: config.outlierDetection, upstream: config.name,
                                  origin: previous?.outlier.origin ?? clock.now, logger: logger)
        breaker = CircuitBreaker(config, metricsFactory: metricsFactory)
        adaptive = config.adaptiveConcurrency.map { adaptiveConfig in
            // The same limit and minimum go on across a reload that keeps its settings.
            if let kept = previous?.adaptive, kept.config == adaptiveConfig, previous?.loops === loops { return kept }
            return AdaptiveConcurrency(config: adaptiveConfig, upstream: config.name, rows: loops.count + 1,
                                       origin: clock.now, metricsFactory: metricsFactory)
        }
        let policy = config.balance.makePolicy()
        self.policy = policy
        let healthChecks = HealthChecks(config: config.healthCheck, upstream: config.name, clock: clock, logger: logger)
        self.healthChecks = healthChecks
        let name = config.name
        let makeEndpoint: @Sendable (URL, UpstreamConfig) -> EndpointState = { url, own in
            EndpointState(url: url, config: own, client: makeClient(own),
                          metrics: EndpointMetrics(upstream: name, endpoint: UpstreamTarget(baseURL: url).authority,
                                                   factory: metricsFactory))
        }
        let initial: [EndpointState]
        let columns: Int
        /// Each endpoint taken over: its column here and in `previous`.
        var keptColumns: [(new: Int, old: Int)] = []
        if let refresh = config.dnsRefresh, let host = config.url.host {
            // Until the first answer: the name itself, resolved by the transport per connection.
            initial = [makeEndpoint(config.url, Self.endpointConfig(config, url: config.url))]
            source = .resolved(EndpointResolution(
                host: host, refresh: refresh, resolver: resolver, config: config, initial: EndpointSet(initial, columns: [0]),
                rows: loops.count + 1, clock: clock, logger: logger, makeEndpoint: makeEndpoint))
            columns = EndpointResolution.columns
        } else {
            let reusable = previous.map { previous in
                Dictionary(previous.endpoints.map { ($0.address, $0) }, uniquingKeysWith: { first, _ in first })
            } ?? [:]
            var takenOver: Set<String> = []
            let previousColumns: [String: Int] = if let previous, case .fixed(let set) = previous.source {
                Dictionary(zip(set.endpoints.map(\.address), set.columns), uniquingKeysWith: { first, _ in first })
            } else { [:] }
            initial = config.endpoints.enumerated().map { index, url in
                let own = Self.endpointConfig(config, url: url)
                if let kept = reusable[UpstreamTarget(baseURL: url).authority], kept.config == own {
                    takenOver.insert(kept.address)
                    if let old = previousColumns[kept.address] { keptColumns.append((index, old)) }
                    return kept
                }
                return makeEndpoint(url, own)
            }
            previous?.handOver(takenOver)
            source = .fixed(EndpointSet(initial, columns: Array(initial.indices)))
            columns = initial.count
        }
        let layout = RowLayout(columns: columns, stateWords: type(of: policy).stateWords, columnWords: type(of: policy).columnWords)
        self.layout = layout
        let rows = (0...loops.count).map { _ in layout.makeRow() }
        self.rows = rows
        if let previous, type(of: previous.policy) == type(of: policy), layout.columnWords > 0 {
            // The policy's words of each endpoint taken over (`ewma`'s estimates), loop by loop.
            for (row, old) in zip(rows, previous.rows) {
                for (new, oldColumn) in keptColumns {
                    for word in 0..<layout.columnWords {
                        row.store(layout.columnSlot(word, of: new), old.load(previous.layout.columnSlot(word, of: oldColumn)))
                    }
                }
            }
        }
        healthChecks.start(initial)
        if case .resolved(let resolution) = source {
            resolution.start { added, removed in
                healthChecks.stop(removed)
                healthChecks.start(added)
            }
        }
    }

    nonisolated(nonsending) public func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        try adaptive?.admit()
        do { try breaker?.admit() } catch {
            adaptive?.release()
            throw error
        }
        // Until the exchange is over: at the response head, or for a streamed body when it ends
        // (`followStream`, which then takes these over).
        var streaming = false
        defer {
            if !streaming {
                breaker?.release()
                adaptive?.release()
            }
        }
        let rowIndex = loops.currentIndex ?? loops.count
        let row = rows[rowIndex]
        let set = currentSet(rowIndex)
        let now = outlier.moment(context.clock.now)
        let pick = context.stats.update { values in
            // A hedge (`RacingEndpoint`, set only while attempts race) avoids the attempt it races.
            let racing = values[RacingEndpoint.self]
            let pick = self.pick(now: now, avoiding: values[FailedEndpoint.self] ?? racing?.column, row: row, set: set)
            values.recordEndpoint(set.endpoints[pick.index].address)
            if racing != nil { values[RacingEndpoint.self] = RacingEndpoint.Mark(column: set.columns[pick.index]) }
            return pick
        }
        let endpoint = set.endpoints[pick.index]
        let column = set.columns[pick.index]
        // A lone endpoint without a breaker has nothing to follow a streamed body for.
        let followsStreams = breaker != nil || adaptive != nil || set.endpoints.count > 1
        if pick.allDown { metrics.allDown.increment() }
        endpoint.metrics.requests.increment()
        row.add(column, 1)
        defer { if !streaming { row.add(column, -1) } }
        let sent = context.clock.now
        do {
            var response = try await endpoint.client.send(request, context: context)
            let failure = EndpointFailure(status: response.status.code, policy: config.outlierDetection.failures)
            let follow = followsStreams && response.body.isStreamed
            // A good head's latency is the endpoint's (a fast error says nothing of how fast it answers).
            if failure == nil { observe(since: sent, column: column, row: row, rowIndex: rowIndex, clock: context.clock) }
            if let failure {
                outlier.failed(endpoint, failure, at: outlier.moment(context.clock.now), among: set.endpoints)
                context.stats.update { $0[FailedEndpoint.self] = column }
            } else if !follow {
                outlier.succeeded(endpoint, at: outlier.moment(context.clock.now), allDown: pick.allDown)
            }
            if follow {
                streaming = true
                followStream(&response.body, endpoint: endpoint, set: set, row: row, rowIndex: rowIndex, column: column,
                             clock: context.clock, success: failure == nil ? pick.allDown : nil)
            }
            return response
        } catch {
            if let failure = EndpointFailure(error: error) {
                // A timeout is latency too: the slowest kind.
                if failure == .timeout { observe(since: sent, column: column, row: row, rowIndex: rowIndex, clock: context.clock) }
                outlier.failed(endpoint, failure, at: outlier.moment(context.clock.now), among: set.endpoints)
                context.stats.update { $0[FailedEndpoint.self] = column }
            }
            throw error
        }
    }

    /// An attempt's answer came: its latency to the policy (this loop's row) and the adaptive limit.
    @inline(__always)
    private func observe(since sent: ContinuousClock.Instant, column: Int, row: LoopSlots, rowIndex: Int, clock: any GatewayClock) {
        let now = clock.now
        let latency = sent.duration(to: now)
        if layout.columnWords > 0 {
            policy.observe(latency: OutlierDetector.nanoseconds(latency), column: column, row: row, layout: layout, at: outlier.moment(now))
        }
        adaptive?.record(latency: latency, row: rowIndex, at: now)
    }

    /// A streamed response is in flight until its body ends, not at its head: the breaker's
    /// count and the loop's in-flight count for `least_request` are given back then, and an
    /// upstream that resets or closes short mid-body counts against its endpoint (`reset`).
    /// Whether a good head was a success is known only then too: `success` (the pick's
    /// `allDown`, or nil when the head already failed) is recorded when the body ends whole.
    /// The body's end comes on its reader's thread (the daemon thread paired with the loop):
    /// the loop's own row is written back on the loop, so no other thread writes it.
    private func followStream(_ body: inout Body, endpoint: EndpointState, set: EndpointSet, row: LoopSlots, rowIndex: Int,
                              column: Int, clock: any GatewayClock, success allDown: Bool?) {
        let breaker = breaker, adaptive = adaptive, outlier = outlier
        let loop = rowIndex < loops.count ? loops.loops[rowIndex] : nil
        body.append(StreamObserver(clock: clock, onEnd: { observation in
            breaker?.release()
            adaptive?.release()
            if let loop, !loop.inEventLoop {
                loop.execute { row.add(column, -1) }
            } else {
                row.add(column, -1)
            }
            switch observation.ending {
            case .complete: if let allDown { outlier.succeeded(endpoint, at: outlier.moment(clock.now), allDown: allDown) }
            case .upstreamReset: outlier.failed(endpoint, .reset, at: outlier.moment(clock.now), among: set.endpoints)
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
        if case .resolved(let resolution) = source {
            draining = await resolution.stop()
        }
        await healthChecks.stopAll()
        let kept = handedOver.withLock { $0 }
        for endpoint in endpoints + draining where !kept.contains(endpoint.address) {
            await releasing(endpoint.client)
        }
    }

    /// A successor took these endpoints over: their health is its to check, their clients its to
    /// shut down. This upstream only finishes the exchanges it has in flight.
    private func handOver(_ addresses: Set<String>) {
        handedOver.withLock { $0.formUnion(addresses) }
        healthChecks.cancelAll()
    }

    /// One endpoint's transport settings: the upstream's, at `url`, without what only the
    /// balancer reads (so a change of those keeps the endpoint's client and records at a reload).
    static func endpointConfig(_ config: UpstreamConfig, url: URL) -> UpstreamConfig {
        var own = config
        own.url = url
        own.endpoints = [url]
        own.circuitBreaker = nil
        own.adaptiveConcurrency = nil
        own.healthCheck = nil
        own.balance = .roundRobin
        own.outlierDetection = OutlierDetectionConfig()
        return own
    }

    // MARK: Reading (reports: loads only)

    /// Requests the breaker counts now (`nil` without one).
    var breakerInFlight: Int? { breaker?.current }

    /// Requests in flight on the endpoint of `column` (its index, for configured endpoints), over
    /// every loop.
    public func inFlight(_ index: Int) -> Int {
        max(0, rows.reduce(0) { $0 + $1.load(index) })
    }

    /// What `endpoint` is now (`OutlierDetector.status`).
    public func status(of endpoint: EndpointState) -> EndpointStatus {
        outlier.status(of: endpoint, at: clock.now)
    }

    /// The endpoints now, each with its status.
    public var statuses: [(endpoint: EndpointState, status: EndpointStatus)] {
        let now = outlier.moment(clock.now)
        return currentSet().endpoints.map { ($0, outlier.status(of: $0, at: now)) }
    }

    // MARK: Picking

    struct Pick {
        var index: Int
        /// No endpoint was up: this one was picked among all.
        var allDown: Bool
    }

    /// The endpoint for one attempt, by the policy, among those whose status takes traffic, other
    /// than `avoiding` (the column of the one whose attempt just failed) when there are any; among
    /// all when none is up.
    func pick(now: Int64, avoiding avoidedColumn: Int?, row: LoopSlots, set: EndpointSet) -> Pick {
        var mask: UInt64 = 0
        var up = false
        for (index, endpoint) in set.endpoints.enumerated() {
            let status = outlier.status(of: endpoint, at: now)
            guard status.takesTraffic else { continue }
            mask |= UInt64(1) << UInt64(index)
            if status.isUp { up = true }
        }
        let allDown = !up
        if allDown { mask = set.allMask }
        if let avoidedColumn, let avoiding = set.columns.firstIndex(of: avoidedColumn) {
            let others = mask & ~(UInt64(1) << UInt64(avoiding))
            if others != 0 { mask = others }
        }
        let candidates = Candidates(mask: mask)
        guard candidates.count > 1 else { return Pick(index: mask.trailingZeroBitCount, allDown: allDown) }
        let index = policy.pick(candidates, row: row, columns: set.columns, layout: layout, now: now)
        return Pick(index: index, allDown: allDown)
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
