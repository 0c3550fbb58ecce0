import Tracing

/// Hedged attempts (issue #44): when an attempt has no response head after the hedge delay, the
/// same request goes out again — to another endpoint when the upstream has one (the balancer
/// reads `RacingEndpoint`) — at most `max_extra` times per request, each paid from the retry
/// budget. `HedgeRace` decides the winner; the attempts still running are then cancelled at once
/// (both transports close a connection cancelled mid-exchange: `nio` closes its channel,
/// `urlsession` cancels its task, so none is reused half-read), and a response that lost has its
/// body discarded.
extension RetryMiddleware {
    enum RaceEvent: Sendable {
        /// Attempt `number` (0: the first) ended, after running since `started`.
        case ended(number: Int, HedgeRace.Outcome, started: ContinuousClock.Instant)
        case hedgeDue
    }

    /// What a request's races did: the access log's and the trace's account.
    public struct HedgeTally: Sendable, Equatable {
        public var sent = 0
        public var won = 0
        public var cancelled = 0
        /// The attempt of the last race whose outcome went back: 1 the first, 2 the first hedge…
        public var winner = 1
    }

    public enum Tally: RequestStatsKey { public typealias Value = HedgeTally }

    static let hedges = LabelledCounters("portico_hedges_total")

    /// How long an attempt runs alone on `route` now; `nil`: no hedge (a percentile without
    /// enough recent samples yet).
    func hedgeDelay(route: String, now: ContinuousClock.Instant) -> Duration? {
        guard let hedge = config.hedge else { return nil }
        switch hedge.after {
        case .fixed(let delay):
            return max(delay, hedge.min)
        case .percentile:
            guard let estimate = latencies?[route].estimate(at: now) else { return nil }
            return max(estimate, hedge.min)
        }
    }

    /// A response head's latency, for `after: pNN`.
    func recordLatency(route: String, since started: ContinuousClock.Instant, now: ContinuousClock.Instant) {
        latencies?[route].record(started.duration(to: now), at: now)
    }

    /// One attempt raced by up to `hedgesLeft` hedges, each `delay` after the one before; each
    /// attempt has its own per-try deadline.
    func race(_ request: GatewayRequest, context: RequestContext, delay: Duration, hedgesLeft: inout Int,
              next: @escaping NextHandler) async -> HedgeRace.Outcome {
        let clock = context.clock
        let route = context.route ?? ""
        let overall = context.deadline
        let stats = context.stats
        stats.update { $0[RacingEndpoint.self] = RacingEndpoint.Mark() }
        defer { stats.update { $0[RacingEndpoint.self] = nil } }
        var left = hedgesLeft
        let (outcome, tally) = await withTaskGroup(of: RaceEvent.self) { group in
            var race = HedgeRace()
            var tally = stats.update { $0[Tally.self] } ?? HedgeTally()
            // The access log's endpoint of each attempt when the next went out (the balancer
            // records the latest pick): restored when an earlier attempt wins.
            var endpoints: [String?] = []
            var outcome: HedgeRace.Outcome = .failure(CancellationError())
            Self.addAttempt(0, to: &group, request: request, context: attemptContext(context, startingAt: clock.now), next: next)
            Self.addTimer(to: &group, clock: clock, at: clock.now.advanced(by: delay))
            while let event = await group.next() {
                switch event {
                case .hedgeDue:
                    guard race.wantsHedge, left > 0, !Task.isCancelled else { continue }
                    let now = clock.now
                    guard now < overall else { continue }
                    guard budget.tryAcquireRetry(at: now) else {
                        Self.budgetExhausted.increment([("route", route)])
                        stats.update { $0.extra.append(("hedge_stopped", "budget")) }
                        continue
                    }
                    left -= 1
                    endpoints.append(stats.update { $0.extra.first { $0.0 == "endpoint" }?.1 })
                    Self.addAttempt(race.launched, to: &group, request: request, context: attemptContext(context, startingAt: now),
                                    hedge: delay, next: next)
                    race.hedgeSent()
                    tally.sent += 1
                    Self.hedges.increment([("route", route), ("outcome", "sent")])
                    if left > 0 { Self.addTimer(to: &group, clock: clock, at: now.advanced(by: delay)) }
                case .ended(let number, let ended, let started):
                    if ended.response != nil { recordLatency(route: route, since: started, now: clock.now) }
                    let final = ended.response != nil && retryReason(ended) == nil
                    switch race.ended(number, ended, final: final) {
                    case .waiting(let discard), .late(let discard):
                        discard?.discardBody(Self.lostRace)
                    case .won(let winner, let won, let cancelling, let discard):
                        discard?.discardBody(Self.lostRace)
                        outcome = won
                        tally.winner = winner + 1
                        tally.cancelled += cancelling
                        if winner > 0 {
                            tally.won += 1
                            Self.hedges.increment([("route", route), ("outcome", "won")])
                        }
                        if cancelling > 0 { Self.hedges.increment([("route", route), ("outcome", "cancelled")], by: Int64(cancelling)) }
                        if winner < endpoints.count, let address = endpoints[winner] {
                            stats.update { $0.recordEndpoint(address) }
                        }
                        // The losers' connections close now; the timer stops.
                        group.cancelAll()
                    }
                }
            }
            return (outcome, tally)
        }
        hedgesLeft = left
        if tally.sent > 0 {
            stats.update { values in
                values[Tally.self] = tally
                values.setExtra("hedges", String(tally.sent))
                values.setExtra("hedge_winner", String(tally.winner))
                values.setExtra("hedges_cancelled", String(tally.cancelled))
            }
        }
        return outcome
    }

    private static let lostRace = GatewayError(.clientClosedRequest, message: "a hedged attempt lost the race")

    private static func addAttempt(_ number: Int, to group: inout TaskGroup<RaceEvent>, request: GatewayRequest,
                                   context: RequestContext, hedge delay: Duration? = nil, next: @escaping NextHandler) {
        group.addTask {
            let started = context.clock.now
            do {
                let response = if let delay {
                    try await tracedHedge(number: number, delay: delay) { try await next(request, context) }
                } else {
                    try await next(request, context)
                }
                return .ended(number: number, .success(response), started: started)
            } catch {
                return .ended(number: number, .failure(error), started: started)
            }
        }
    }

    private static func addTimer(to group: inout TaskGroup<RaceEvent>, clock: any GatewayClock, at instant: ContinuousClock.Instant) {
        group.addTask {
            try? await clock.sleep(until: instant)
            return .hedgeDue
        }
    }

    /// A hedge in a `hedge` span of the traced request in force (its attempt's client span below).
    static func tracedHedge(number: Int, delay: Duration,
                            _ attempt: @Sendable () async throws -> GatewayResponse) async throws -> GatewayResponse {
        try await TracingPipeline.span("hedge", attributes: [
            "portico.hedge.number": .int64(Int64(number)),
            "portico.hedge.delay_ms": .int64(Int64(delay / .milliseconds(1))),
        ], attempt)
    }
}

/// Set while a request's attempts race: the balancer records in it the endpoint it picked for
/// each, and a hedge's pick avoids the one recorded last (the attempt it races) when it can.
enum RacingEndpoint: RequestStatsKey {
    struct Mark: Sendable {
        /// The column (in its upstream) of the latest pick.
        var column: Int?
    }
    typealias Value = Mark
}

extension RequestStats.Values {
    /// Sets an access-log field, replacing an earlier value.
    mutating func setExtra(_ key: String, _ value: String) {
        if let index = extra.firstIndex(where: { $0.0 == key }) {
            extra[index].1 = value
        } else {
            extra.append((key, value))
        }
    }
}
