/// One credential's token decisions as a value: which token a caller gets, when a refresh
/// starts, what a finished refresh changes, and how long failures back off. `TokenManager` (the
/// actor) holds one and does what it answers: it runs the refresh task, sleeps until the next
/// attempt, counts and logs. Nothing here waits, reads a clock or touches a task, so every
/// transition is tested as a value (`TokenLifecycleTests`).
struct TokenLifecycle {
    typealias Instant = ContinuousClock.Instant

    enum Phase: Equatable {
        /// No refresh in flight.
        case idle
        /// One refresh in flight: every caller that needs a token joins it (single flight).
        case refreshing
        /// Shut down: tokens are refused and a refresh that ends is dropped.
        case shutDown
    }

    /// What a refresh sends: the refresh grant's token, and the token it replaces (the one held
    /// or the one an upstream rejected), which a shared source must not hand back.
    struct Refresh: Equatable {
        var refreshToken: String?
        var replacing: String?
    }

    /// What a caller asking for a token gets.
    enum Demand: Equatable {
        case serve(AccessToken)
        /// Valid but due: served now, and a refresh starts behind the caller's back.
        case serveAndRefresh(AccessToken, Refresh)
        /// Wait for the refresh in flight.
        case join
        /// No valid token: start a refresh and wait for it.
        case refresh(Refresh)
        /// No valid token and backing off (or shut down): fail at once.
        case refuse
    }

    /// What a finished refresh means.
    enum Outcome: Equatable {
        /// A new token; `refreshAt` is when to refresh it in the background (`nil`: proactive
        /// refresh is off).
        case refreshed(AccessToken, lifetime: Duration, refreshAt: Instant?)
        /// The call failed: retry at `retryAt` (after `delay`), serving `still` meanwhile if the
        /// old token is still valid; without one, callers are refused until then.
        case failed(TokenEndpointError, delay: Duration, retryAt: Instant, still: AccessToken?)
        /// Ended after shutdown: nothing changes.
        case shutDown
    }

    /// Backoff between failed refreshes: `random(0...min(cap, base·2ⁿ⁻¹))` after the nth failure
    /// (full jitter), at least `floor`.
    struct Backoff: Equatable {
        var base: Duration
        var cap: Duration
        /// Full jitter can draw ~0, which would let the next caller start another attempt at once
        /// (and wait on a hanging IdP) instead of failing fast.
        var floor: Duration

        /// The delay after `failures` consecutive failures; `fraction` in `0...1` is the jitter draw.
        func delay(afterFailures failures: Int, fraction: Double) -> Duration {
            let exponent = min(max(failures - 1, 0), 30)
            let ceiling = min(cap, base * (1 << exponent))
            let fraction = min(1, max(0, fraction))
            return max(min(floor, ceiling), ceiling * fraction)
        }
    }

    let refreshBeforeExpiry: Duration
    let defaultLifetime: Duration
    let backoff: Backoff
    let proactiveRefresh: Bool

    private(set) var phase: Phase = .idle
    private(set) var token: AccessToken?
    private(set) var refreshToken: String?
    private(set) var failures = 0
    /// Until then, callers without a valid token are refused.
    private(set) var nextAttempt: Instant?
    private(set) var lastError: TokenEndpointError?
    /// When the last refresh ended; `lastError` says how.
    private(set) var lastRefresh: Instant?
    /// The token an upstream rejected last, until a refresh replaces it.
    private var rejected: String?

    init(refreshBeforeExpiry: Duration, defaultLifetime: Duration, backoff: Backoff,
         proactiveRefresh: Bool, refreshToken: String?) {
        self.refreshBeforeExpiry = refreshBeforeExpiry
        self.defaultLifetime = defaultLifetime
        self.backoff = backoff
        self.proactiveRefresh = proactiveRefresh
        self.refreshToken = refreshToken
    }

    // MARK: Transitions

    /// A caller needs a token at `now`.
    mutating func demand(at now: Instant) -> Demand {
        if phase == .shutDown { return .refuse }
        if let token, now < token.expiry {
            if now >= token.refreshAt, phase == .idle, mayAttempt(at: now) {
                return .serveAndRefresh(token, beginRefresh())
            }
            return .serve(token)
        }
        if phase == .refreshing { return .join }
        guard mayAttempt(at: now) else { return .refuse }
        return .refresh(beginRefresh())
    }

    /// The background timer fired (the token is due, or the backoff ended): a refresh to start,
    /// `.join` when one is in flight already, `.refuse` after shutdown.
    mutating func backgroundDue() -> Demand {
        switch phase {
        case .shutDown: return .refuse
        case .refreshing: return .join
        case .idle: return .refresh(beginRefresh())
        }
    }

    /// The refresh in flight ended at `now`; it was sent at `started`. `jitter` is the backoff's
    /// draw in `0...1`, used only on failure.
    mutating func refreshEnded(_ result: Result<TokenResponse, TokenEndpointError>, started: Instant,
                               at now: Instant, jitter: Double) -> Outcome {
        guard phase != .shutDown else { return .shutDown }
        phase = .idle
        lastRefresh = now
        switch result {
        case .success(let response):
            let lifetime = response.expiresIn ?? defaultLifetime
            // Counted from when the call was sent: the IdP started the clock no later.
            let expiry = started + lifetime
            // `refreshBeforeExpiry` ahead, but never before half the lifetime has passed, so a
            // short-lived token does not cause a refresh storm.
            let fresh = AccessToken(value: response.accessToken, type: response.tokenType, expiry: expiry,
                                    refreshAt: expiry - min(refreshBeforeExpiry, lifetime / 2))
            token = fresh
            rejected = nil
            if let rotated = response.refreshToken { refreshToken = rotated }
            failures = 0
            nextAttempt = nil
            lastError = nil
            return .refreshed(fresh, lifetime: lifetime, refreshAt: proactiveRefresh ? fresh.refreshAt : nil)
        case .failure(let error):
            failures += 1
            lastError = error
            let delay = backoff.delay(afterFailures: failures, fraction: jitter)
            let retryAt = now + delay
            nextAttempt = retryAt
            // Recovery does not wait for a request: the actor retries at `retryAt`.
            return .failed(error, delay: delay, retryAt: retryAt, still: validToken(at: now))
        }
    }

    /// An upstream rejected `value`: dropped if it is still the token held (a newer one another
    /// request fetched is kept), and the next caller may refresh at once — a rejected token says
    /// nothing about the IdP.
    mutating func invalidate(_ value: String) {
        guard let token, token.value == value else { return }
        self.token = nil
        rejected = value
        nextAttempt = nil
    }

    /// Stops for good; answers whether a refresh was in flight (the actor cancels it).
    mutating func shutDown() -> Bool {
        defer { phase = .shutDown }
        return phase == .refreshing
    }

    /// The token held if it is still usable at `now`.
    func validToken(at now: Instant) -> AccessToken? {
        guard let token, now < token.expiry else { return nil }
        return token
    }

    // MARK: Helpers

    private func mayAttempt(at now: Instant) -> Bool {
        guard let nextAttempt else { return true }
        return now >= nextAttempt
    }

    private mutating func beginRefresh() -> Refresh {
        phase = .refreshing
        return Refresh(refreshToken: refreshToken, replacing: token?.value ?? rejected)
    }
}
