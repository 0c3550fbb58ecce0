import Foundation
import HTTPTypes

/// Repeats failed upstream attempts that are safe and likely to succeed: idempotent methods
/// (unless configured), replayable bodies, connect errors / timeouts / resets / configured
/// statuses. A streamed request body is sent once, never retried; a discarded response's
/// streamed body is cancelled before the next attempt. Place it inside caching and outside auth: every attempt calls `next`, so inner
/// middleware (credential injection) runs again for each attempt.
///
/// Time: waits use full-jitter exponential backoff, or the upstream's `Retry-After` when it
/// is at most `max_retry_after` (a longer one returns the response at once: the client
/// should decide whether to wait that long). Each attempt gets `per_try_timeout` as its
/// deadline, never beyond the request's own; a retry starts only when its whole per-try
/// timeout (without one: any time at all) still fits before the request's deadline.
///
/// Load: a `RetryBudget` shared by the instance bounds retries to a fraction of traffic.
///
/// Tail: with `hedge`, an attempt still without a response head after the hedge delay is raced
/// by another (`RetryMiddleware+Hedging`), paid from the same budget.
public struct RetryMiddleware: Middleware {
    public let config: RetryConfig
    public let budget: RetryBudget
    /// Each route's recent upstream latency, for `hedge.after: pNN` (nil otherwise).
    let latencies: RouteLatencies?
    let backoff: Backoff
    /// Uniform in `[0, 1)`; injectable so tests can pin the jitter.
    let random: @Sendable () -> Double
    let retryStatuses: Set<Int>
    let methods: Set<String>

    static let retries = LabelledCounters("portico_retries_total")
    static let budgetExhausted = LabelledCounters("portico_retry_budget_exhausted_total")

    /// `latencies`: a predecessor's estimators, kept when they estimate the same percentile.
    public init(_ config: RetryConfig, budget: RetryBudget? = nil,
                random: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) }) {
        self.init(config, budget: budget, latencies: nil, random: random)
    }

    init(_ config: RetryConfig, budget: RetryBudget?, latencies: RouteLatencies?,
         random: @escaping @Sendable () -> Double = { Double.random(in: 0..<1) }) {
        self.config = config
        self.budget = budget ?? RetryBudget(ratio: config.budget, minPerSecond: config.minRetriesPerSecond)
        if case .percentile(let percentile) = config.hedge?.after {
            let settings = LatencyEstimator.Settings(percentile: percentile)
            self.latencies = latencies?.settings == settings ? latencies : RouteLatencies(settings)
        } else {
            self.latencies = nil
        }
        self.backoff = Backoff(base: config.backoffBase, cap: config.backoffCap)
        self.random = random
        self.retryStatuses = Set(config.on.compactMap { condition -> Int? in
            guard case .status(let code) = condition else { return nil }
            return code
        })
        self.methods = Set(config.methods)
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        let clock = context.clock
        budget.recordRequest(at: clock.now)
        guard config.attempts > 1 || config.hedge != nil, methods.contains(request.method.rawValue) else {
            return try await next(request, context)
        }
        guard request.body.isReplayable else {
            // A streamed upload is consumed as it is sent: there is nothing to send again.
            context.logger.debug("request body is streamed: not retried")
            return try await next(request, context)
        }
        let route = context.route ?? ""
        let overall = context.deadline
        var hedgesLeft = config.hedge?.maxExtra ?? 0
        var attempt = 1
        while true {
            let outcome: Result<GatewayResponse, any Error>
            if hedgesLeft > 0, let delay = hedgeDelay(route: route, now: clock.now) {
                // The race ends before `handle` returns: its tasks never outlive `next`.
                outcome = await withoutActuallyEscaping(next) { next in
                    await race(request, context: context, delay: delay, hedgesLeft: &hedgesLeft, next: next)
                }
                if Task.isCancelled || (outcome.failure is CancellationError) {
                    outcome.response?.discardBody(GatewayError(.clientClosedRequest, message: "the request was cancelled"))
                    throw CancellationError()
                }
            } else {
                let started = clock.now
                do {
                    let response = try await next(request, attemptContext(context, startingAt: started))
                    recordLatency(route: route, since: started, now: clock.now)
                    outcome = .success(response)
                } catch let error as CancellationError {
                    throw error
                } catch {
                    outcome = .failure(error)
                }
            }
            guard attempt < config.attempts, let reason = retryReason(outcome) else {
                return try outcome.get()
            }

            var delay = backoff.delay(forRetry: attempt, unit: random())
            if case .success(let response) = outcome, let value = response.headerFields[.retryAfter] {
                if let asked = RetryAfter.delay(value, now: clock.wallNow) {
                    guard asked <= config.maxRetryAfter else {
                        context.stats.update { $0.extra.append(("retry_stopped", "retry_after")) }
                        return response
                    }
                    delay = max(delay, asked)
                }
            }
            let start = clock.now.advanced(by: delay)
            let left = start.duration(to: overall)
            guard left > .zero, left >= (config.perTryTimeout ?? .zero) else {
                context.stats.update { $0.extra.append(("retry_stopped", "deadline")) }
                return try outcome.get()
            }
            guard budget.tryAcquireRetry(at: clock.now) else {
                Self.budgetExhausted.increment([("route", route)])
                context.stats.update { $0.extra.append(("retry_stopped", "budget")) }
                return try outcome.get()
            }
            // The response this retry replaces is never read: a streamed body is cancelled now,
            // releasing its upstream connection before the backoff.
            if case .success(let discarded) = outcome {
                discarded.discardBody(GatewayError(.clientClosedRequest, message: "the response was discarded for a retry"))
            }
            Self.retries.increment([("route", route), ("reason", reason.description)])
            context.logger.debug("retrying upstream request", metadata: [
                "attempt": "\(attempt + 1)", "reason": "\(reason)", "delay": "\(delay)",
            ])
            if delay > .zero {
                try await Self.tracedWait(attempt: attempt, reason: reason.description, delay: delay) {
                    try await clock.sleep(until: start)
                }
            }
            attempt += 1
        }
    }

    /// The context of an attempt starting at `start`: its deadline is `per_try_timeout` on,
    /// never past the request's.
    func attemptContext(_ context: RequestContext, startingAt start: ContinuousClock.Instant) -> RequestContext {
        guard let perTry = config.perTryTimeout else { return context }
        var attemptContext = context
        attemptContext.deadline = min(context.deadline, start.advanced(by: perTry))
        return attemptContext
    }

    /// Why this outcome deserves another attempt, or `nil` when it does not.
    func retryReason(_ outcome: Result<GatewayResponse, any Error>) -> RetryConfig.Condition? {
        switch outcome {
        case .success(let response):
            let code = response.status.code
            return retryStatuses.contains(code) ? .status(code) : nil
        case .failure(let error):
            guard let condition = Self.classify(error), config.on.contains(condition) else { return nil }
            return condition
        }
    }

    /// The condition a failure meets, from its kind alone (the message never matters): connect
    /// failures, resets and timeouts; TLS failures are not retried (a bad certificate stays bad).
    public static func classify(_ error: any Error) -> RetryConfig.Condition? {
        guard let error = error as? GatewayError else { return nil }
        switch error.kind {
        case .upstreamTimeout, .upstreamConnectTimeout: return .timeout
        case .upstreamConnectFailed: return .connectError
        case .upstreamConnectionClosed: return .reset
        default: return nil
        }
    }
}
