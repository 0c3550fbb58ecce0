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
    private let timeout: Duration
    private let jitter: @Sendable () -> Double
    private let logger: Logger

    /// Every decision: which token a caller gets, when to refresh, how long to back off.
    private var lifecycle: TokenLifecycle
    /// The refresh in flight, while `lifecycle.phase` is `.refreshing`.
    private var inFlight: Task<AccessToken, any Error>?
    /// Sleeps until the next proactive refresh or retry.
    private var scheduled: Task<Void, Never>?

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
        self.timeout = timeout
        self.jitter = options.jitter
        self.logger = logger
        lifecycle = TokenLifecycle(
            refreshBeforeExpiry: refreshBeforeExpiry, defaultLifetime: defaultLifetime,
            backoff: .init(base: options.backoffBase, cap: options.backoffCap, floor: options.backoffFloor),
            proactiveRefresh: options.proactiveRefresh, refreshToken: refreshToken)
        refreshSuccesses = Counter(label: "portico_token_refreshes_total", dimensions: [("credential", name), ("result", "success")])
        refreshFailures = Counter(label: "portico_token_refreshes_total", dimensions: [("credential", name), ("result", "failure")])
        expiryGauge = Gauge(label: "portico_token_expiry_seconds", dimensions: [("credential", name)])
    }

    /// A valid token: the cached one, or the result of the one refresh in flight.
    /// Throws `GatewayError` 503 `credentials_unavailable` when none can be had.
    public func token() async throws -> AccessToken {
        switch lifecycle.demand(at: clock.now) {
        case .serve(let token):
            return token
        case .serveAndRefresh(let token, let refresh):
            _ = startRefresh(refresh)
            return token
        case .join:
            return try await inFlightRefresh().value
        case .refresh(let refresh):
            return try await startRefresh(refresh).value
        case .refuse:
            throw unavailable()
        }
    }

    /// Drops `token` if it is still the current one (an upstream rejected it). A newer token
    /// another request already fetched is kept.
    public func invalidate(token: String) {
        lifecycle.invalidate(token)
    }

    /// Cancels the background refresh and any call in flight. The manager then refuses tokens.
    public func shutdown() {
        _ = lifecycle.shutDown()
        scheduled?.cancel()
        scheduled = nil
        inFlight?.cancel()
        source.shutdown()
    }

    public var status: Status {
        Status(hasToken: lifecycle.token != nil, expiry: lifecycle.token?.expiry,
               refreshing: lifecycle.phase == .refreshing, consecutiveFailures: lifecycle.failures,
               nextAttempt: lifecycle.nextAttempt, lastError: lifecycle.lastError,
               lastRefresh: lifecycle.lastRefresh, observedAt: clock.now)
    }

    // MARK: - Refreshing

    private func unavailable() -> GatewayError {
        if lifecycle.phase == .shutDown {
            return .credentialsUnavailable(name, "the credential was shut down", cause: nil)
        }
        var detail = "no valid token"
        if let lastError = lifecycle.lastError { detail += " (\(lastError.description))" }
        return .credentialsUnavailable(name, detail, cause: lifecycle.lastError)
    }

    /// The refresh the lifecycle says is in flight.
    private func inFlightRefresh() -> Task<AccessToken, any Error> {
        guard let inFlight else {
            preconditionFailure("the token lifecycle is refreshing with no refresh task")
        }
        return inFlight
    }

    /// Starts the refresh the lifecycle just began.
    private func startRefresh(_ refresh: TokenLifecycle.Refresh) -> Task<AccessToken, any Error> {
        let source = source
        let clock = clock
        let started = clock.now
        let deadline = started.advanced(by: timeout)
        let task = Task<AccessToken, any Error> {
            let result = await Self.traced(credential: self.name) {
                await Self.fetch(source, refreshToken: refresh.refreshToken, replacing: refresh.replacing,
                                 clock: clock, deadline: deadline)
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
        let now = clock.now
        switch lifecycle.refreshEnded(result, started: started, at: now, jitter: jitter()) {
        case .shutDown:
            throw unavailable()
        case .refreshed(let token, let lifetime, let refreshAt):
            refreshSuccesses.increment()
            expiryGauge.record(Self.seconds(now.duration(to: token.expiry)))
            logger.debug("token refreshed", metadata: ["credential": .string(name),
                                                        "expires_in_s": .stringConvertible(Int(Self.seconds(lifetime)))])
            if let refreshAt { schedule(at: refreshAt) }
            return token
        case .failed(let error, let delay, let retryAt, let still):
            refreshFailures.increment()
            expiryGauge.record(still.map { Self.seconds(now.duration(to: $0.expiry)) } ?? 0)
            logger.warning("token refresh failed", metadata: [
                "credential": .string(name), "error": .string(error.description),
                "failures": .stringConvertible(lifecycle.failures),
                "retry_in_ms": .stringConvertible(delay / .milliseconds(1)),
            ])
            schedule(at: retryAt)
            if let still { return still }
            throw unavailable()
        }
    }

    /// Replaces the background task with one that refreshes at `instant`.
    private func schedule(at instant: ContinuousClock.Instant) {
        guard lifecycle.phase != .shutDown else { return }
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
        guard !Task.isCancelled else { return }
        switch lifecycle.backgroundDue() {
        case .refresh(let refresh): _ = try? await startRefresh(refresh).value
        case .join: _ = try? await inFlightRefresh().value
        case .serve, .serveAndRefresh, .refuse: return
        }
    }

    private static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}
