import Logging
import Metrics

/// Where a token manager gets tokens from: the real token endpoint, or a test double.
public protocol TokenSource: Sendable {
    /// One token call. `refreshToken` is the latest refresh token known (refresh grant only).
    func fetch(refreshToken: String?) async throws(TokenEndpointError) -> TokenResponse
    /// One token call to replace `replacing`: the token the manager holds and wants to refresh,
    /// or the one an upstream just rejected (`nil`: it holds none). A source that can hand out
    /// a token another replica fetched (`SharedTokenSource`) must not hand out that one again.
    func fetch(refreshToken: String?, replacing: String?) async throws(TokenEndpointError) -> TokenResponse
    /// Cancels calls in flight; called once when the manager shuts down.
    func shutdown()
}

extension TokenSource {
    public func fetch(refreshToken: String?, replacing: String?) async throws(TokenEndpointError) -> TokenResponse {
        try await fetch(refreshToken: refreshToken)
    }
}

extension TokenEndpointClient: TokenSource {
    /// Client credentials fetch a fresh token each time; the refresh grant needs a refresh token.
    public func fetch(refreshToken: String?) async throws(TokenEndpointError) -> TokenResponse {
        switch grant {
        case .clientCredentials:
            return try await clientCredentials()
        case .refreshToken:
            guard let refreshToken else { throw TokenEndpointError(.noRefreshToken) }
            return try await refresh(refreshToken: refreshToken)
        }
    }
}

/// A bearer (or other) token held by a `TokenManager`. Its `description` hides the value.
public struct AccessToken: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The raw token, for the header only.
    public var value: String
    public var type: String
    /// When the token stops being usable (monotonic, on the manager's clock).
    public var expiry: ContinuousClock.Instant
    /// When the manager refreshes it in the background.
    public var refreshAt: ContinuousClock.Instant

    /// `Authorization` value: `Bearer <token>`.
    public var headerValue: String { "\(type) \(value)" }

    public var description: String { "AccessToken(type: \(type), value: <redacted>)" }
    public var debugDescription: String { description }
}

/// One credential's OAuth2 token: cached, refreshed ahead of expiry in the background, and
/// refreshed at most once at a time however many requests need it (single flight).
///
/// While the identity provider is failing, a still-valid token keeps being served; without
/// one, callers fail at once with 503 `credentials_unavailable` until the next attempt, and
/// attempts back off exponentially with full jitter. A refresh never outlives `timeout`.
public actor TokenManager {
    /// Backoff between failed refresh attempts: `random(0...min(cap, base·2ⁿ⁻¹))` after the nth
    /// failure (full jitter), at least `backoffFloor`.
    public struct Options: Sendable {
        public var backoffBase: Duration = .milliseconds(500)
        public var backoffCap: Duration = .seconds(30)
        /// The shortest wait: full jitter can draw ~0, which would let the next caller start
        /// another attempt at once (and wait on a hanging IdP) instead of failing fast.
        public var backoffFloor: Duration = .milliseconds(100)
        /// A number in `0...1`; the fraction of the backoff ceiling to wait (full jitter).
        public var jitter: @Sendable () -> Double = { Double.random(in: 0...1) }
        /// Refresh in the background ahead of expiry (off in tests of expiry itself).
        public var proactiveRefresh = true

        public init() {}

        /// These options with a credential's configured backoff.
        func backingOff(base: Duration, cap: Duration) -> Options {
            var options = self
            options.backoffBase = base
            options.backoffCap = cap
            return options
        }
    }

    /// What the manager knows right now (tests, diagnostics). Holds no secret.
    public struct Status: Sendable {
        public var hasToken: Bool
        public var expiry: ContinuousClock.Instant?
        public var refreshing: Bool
        public var consecutiveFailures: Int
        /// Until then, callers without a valid token fail at once.
        public var nextAttempt: ContinuousClock.Instant?
        public var lastError: TokenEndpointError?
        /// When the last refresh ended (`nil`: none yet); `lastError` says how (`nil`: it succeeded).
        public var lastRefresh: ContinuousClock.Instant? = nil
        /// The manager's clock when this was taken: what `expiry` and the other instants count from.
        public var observedAt: ContinuousClock.Instant? = nil
    }

    public nonisolated let name: String
    /// Where tokens come from (read by `/credentials` to say whether the fleet shares them).
    let source: any TokenSource
    private let clock: any GatewayClock
    private let refreshBeforeExpiry: Duration
    private let defaultLifetime: Duration
    private let timeout: Duration
    private let options: Options
    private let logger: Logger

    private var current: AccessToken?
    private var refreshToken: String?
    private var inFlight: Task<AccessToken, any Error>?
    /// Sleeps until the next proactive refresh or retry.
    private var scheduled: Task<Void, Never>?
    private var failures = 0
    private var nextAttempt: ContinuousClock.Instant?
    private var lastError: TokenEndpointError?
    private var lastRefresh: ContinuousClock.Instant?
    /// The token an upstream rejected last, until a refresh replaces it: a shared store must
    /// not hand it back.
    private var rejected: String?
    private var isShutDown = false

    // Created once per manager: handles are not free and the labels never change.
    private let refreshSuccesses: Counter
    private let refreshFailures: Counter
    private let expiryGauge: Gauge

    /// `refreshToken` seeds the refresh grant (`oauth2_refresh_token` credentials).
    public init(name: String, source: any TokenSource, clock: any GatewayClock,
                refreshBeforeExpiry: Duration, defaultLifetime: Duration, timeout: Duration,
                refreshToken: String? = nil, options: Options = Options(), logger: Logger) {
        self.name = name
        self.source = source
        self.clock = clock
        self.refreshBeforeExpiry = refreshBeforeExpiry
        self.defaultLifetime = defaultLifetime
        self.timeout = timeout
        self.refreshToken = refreshToken
        self.options = options
        self.logger = logger
        refreshSuccesses = Counter(label: "portico_token_refreshes_total", dimensions: [("credential", name), ("result", "success")])
        refreshFailures = Counter(label: "portico_token_refreshes_total", dimensions: [("credential", name), ("result", "failure")])
        expiryGauge = Gauge(label: "portico_token_expiry_seconds", dimensions: [("credential", name)])
    }

    /// A valid token: the cached one, or the result of the one refresh in flight.
    /// Throws `GatewayError` 503 `credentials_unavailable` when none can be had.
    public func token() async throws -> AccessToken {
        if isShutDown { throw unavailable() }
        let now = clock.now
        if let current, now < current.expiry {
            if now >= current.refreshAt && inFlight == nil && canAttempt(at: now) {
                // Valid but due: refresh behind the caller's back, never in front of it.
                _ = startRefresh()
            }
            return current
        }
        if let inFlight {
            return try await inFlight.value
        }
        guard canAttempt(at: now) else {
            throw unavailable()
        }
        return try await startRefresh().value
    }

    /// Drops `token` if it is still the current one (an upstream rejected it). A newer token
    /// another request already fetched is kept.
    public func invalidate(token: String) {
        guard let current, current.value == token else { return }
        self.current = nil
        rejected = token
        // A rejected token says nothing about the IdP: the next caller may refresh at once.
        nextAttempt = nil
    }

    /// Cancels the background refresh and any call in flight. The manager then refuses tokens.
    public func shutdown() {
        isShutDown = true
        scheduled?.cancel()
        scheduled = nil
        inFlight?.cancel()
        source.shutdown()
    }

    public var status: Status {
        Status(hasToken: current != nil, expiry: current?.expiry, refreshing: inFlight != nil,
               consecutiveFailures: failures, nextAttempt: nextAttempt, lastError: lastError,
               lastRefresh: lastRefresh, observedAt: clock.now)
    }

    // MARK: - Refreshing

    private func canAttempt(at now: ContinuousClock.Instant) -> Bool {
        guard let nextAttempt else { return true }
        return now >= nextAttempt
    }

    private func unavailable() -> GatewayError {
        var detail = "no valid token"
        if let lastError { detail += " (\(lastError.description))" }
        if isShutDown { detail = "the credential was shut down" }
        return .credentialsUnavailable(name, detail, cause: isShutDown ? nil : lastError)
    }

    private func startRefresh() -> Task<AccessToken, any Error> {
        if let inFlight { return inFlight }
        let source = source
        let clock = clock
        let started = clock.now
        let deadline = started.advanced(by: timeout)
        let refreshToken = refreshToken
        let replacing = current?.value ?? rejected
        let task = Task<AccessToken, any Error> {
            let result = await Self.traced(credential: self.name) {
                await Self.fetch(source, refreshToken: refreshToken, replacing: replacing, clock: clock, deadline: deadline)
            }
            return try self.complete(result, started: started)
        }
        inFlight = task
        return task
    }

    /// One token call raced against the deadline on the injected clock.
    private static func fetch(_ source: any TokenSource, refreshToken: String?, replacing: String?, clock: any GatewayClock,
                              deadline: ContinuousClock.Instant) async -> Result<TokenResponse, TokenEndpointError> {
        await withTaskGroup(of: Result<TokenResponse, TokenEndpointError>?.self) { group in
            group.addTask {
                do throws(TokenEndpointError) {
                    return .success(try await source.fetch(refreshToken: refreshToken, replacing: replacing))
                } catch {
                    return .failure(error)
                }
            }
            group.addTask {
                do {
                    try await clock.sleep(until: deadline)
                    return .failure(TokenEndpointError(.timeout))
                } catch {
                    return nil  // cancelled: the call finished first
                }
            }
            var outcome: Result<TokenResponse, TokenEndpointError> = .failure(TokenEndpointError(.timeout))
            for await result in group {
                if let result {
                    outcome = result
                    break
                }
            }
            group.cancelAll()
            return outcome
        }
    }

    private func complete(_ result: Result<TokenResponse, TokenEndpointError>, started: ContinuousClock.Instant) throws -> AccessToken {
        inFlight = nil
        if isShutDown { throw unavailable() }
        let now = clock.now
        lastRefresh = now
        switch result {
        case .success(let response):
            let lifetime = response.expiresIn ?? defaultLifetime
            // Counted from when the call was sent: the IdP started the clock no later.
            let expiry = started + lifetime
            // `refreshBeforeExpiry` ahead, but never before half the lifetime has passed,
            // so a short-lived token does not cause a refresh storm.
            let token = AccessToken(value: response.accessToken, type: response.tokenType, expiry: expiry,
                                    refreshAt: expiry - min(refreshBeforeExpiry, lifetime / 2))
            current = token
            rejected = nil
            if let rotated = response.refreshToken { refreshToken = rotated }
            failures = 0
            nextAttempt = nil
            lastError = nil
            refreshSuccesses.increment()
            expiryGauge.record(Self.seconds(now.duration(to: token.expiry)))
            logger.debug("token refreshed", metadata: ["credential": .string(name),
                                                        "expires_in_s": .stringConvertible(Int(Self.seconds(lifetime)))])
            if options.proactiveRefresh {
                schedule(at: token.refreshAt)
            }
            return token
        case .failure(let error):
            failures += 1
            lastError = error
            let delay = backoff(afterFailures: failures)
            nextAttempt = now + delay
            refreshFailures.increment()
            expiryGauge.record(current.map { Self.seconds(now.duration(to: $0.expiry)) } ?? 0)
            logger.warning("token refresh failed", metadata: [
                "credential": .string(name), "error": .string(error.description),
                "failures": .stringConvertible(failures), "retry_in_ms": .stringConvertible(delay / .milliseconds(1)),
            ])
            // Recover without waiting for a request: retry when the backoff ends.
            schedule(at: nextAttempt!)
            if let current, now < current.expiry { return current }
            throw unavailable()
        }
    }

    /// The full-jitter delay after `failures` consecutive failures.
    private func backoff(afterFailures failures: Int) -> Duration {
        let exponent = min(failures - 1, 30)
        let ceiling = min(options.backoffCap, options.backoffBase * (1 << exponent))
        let fraction = min(1, max(0, options.jitter()))
        return max(min(options.backoffFloor, ceiling), ceiling * fraction)
    }

    /// Replaces the background task with one that refreshes at `instant`.
    private func schedule(at instant: ContinuousClock.Instant) {
        guard !isShutDown else { return }
        scheduled?.cancel()
        let clock = clock
        // Detached: a refresh scheduled from a request's task is not part of that request's trace.
        scheduled = Task.detached {
            do {
                try await clock.sleep(until: instant)
            } catch {
                return
            }
            await self.backgroundRefresh()
        }
    }

    private func backgroundRefresh() async {
        guard !isShutDown, !Task.isCancelled else { return }
        _ = try? await startRefresh().value
    }

    private static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}
