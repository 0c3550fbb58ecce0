import Testing
@testable import Portico

/// The token manager's decisions as a value: no actor, no clock, no endpoint.
@Suite("TokenLifecycle")
struct TokenLifecycleTests {
    typealias Instant = ContinuousClock.Instant
    let t0 = ContinuousClock.now

    func lifecycle(refreshBeforeExpiry: Duration = .seconds(30), proactive: Bool = true,
                   refreshToken: String? = nil) -> TokenLifecycle {
        TokenLifecycle(refreshBeforeExpiry: refreshBeforeExpiry, defaultLifetime: .seconds(300),
                       backoff: .init(base: .milliseconds(500), cap: .seconds(30), floor: .milliseconds(100)),
                       proactiveRefresh: proactive, refreshToken: refreshToken)
    }

    /// Drives `machine` from cold to holding `value` (lifetime `lifetime`, sent and ended at `at`).
    func holding(_ value: String, lifetime: Duration = .seconds(100), at: Instant? = nil,
                 _ machine: inout TokenLifecycle) -> AccessToken {
        let at = at ?? t0
        guard case .refresh = machine.demand(at: at) else {
            Issue.record("expected a refresh")
            return AccessToken(value: "", type: "", expiry: at, refreshAt: at)
        }
        guard case .refreshed(let token, _, _) = machine.refreshEnded(
            .success(TokenResponse(accessToken: value, expiresIn: lifetime)), started: at, at: at, jitter: 1) else {
            Issue.record("expected a token")
            return AccessToken(value: "", type: "", expiry: at, refreshAt: at)
        }
        return token
    }

    @Test("cold: the first caller refreshes, the others join, a success serves everyone")
    func cold() {
        var machine = lifecycle()
        let r1 = machine.demand(at: t0)
        #expect(r1 == .refresh(.init(refreshToken: nil, replacing: nil)))
        #expect(machine.phase == .refreshing)
        let r2 = machine.demand(at: t0)
        #expect(r2 == .join)
        let outcome = machine.refreshEnded(.success(TokenResponse(accessToken: "a", expiresIn: .seconds(100))),
                                           started: t0, at: t0 + .seconds(1), jitter: 1)
        let token = AccessToken(value: "a", type: "Bearer", expiry: t0 + .seconds(100), refreshAt: t0 + .seconds(70))
        #expect(outcome == .refreshed(token, lifetime: .seconds(100), refreshAt: t0 + .seconds(70)))
        #expect(machine.phase == .idle)
        let r3 = machine.demand(at: t0 + .seconds(2))
        #expect(r3 == .serve(token))
    }

    @Test("the expiry counts from when the call was sent, and a short lifetime refreshes at its half")
    func expiryAndRefreshPoint() {
        var machine = lifecycle(refreshBeforeExpiry: .seconds(30))
        let token = holding("a", lifetime: .seconds(10), &machine)
        #expect(token.expiry == t0 + .seconds(10))
        #expect(token.refreshAt == t0 + .seconds(5))
        var off = lifecycle(proactive: false)
        _ = off.demand(at: t0)
        let r4 = off.refreshEnded(.success(TokenResponse(accessToken: "b")), started: t0, at: t0, jitter: 1)
        #expect(r4 == .refreshed(AccessToken(value: "b", type: "Bearer", expiry: t0 + .seconds(300), refreshAt: t0 + .seconds(270)),
                          lifetime: .seconds(300), refreshAt: nil))
    }

    @Test("valid but due: served at once, and exactly one background refresh starts")
    func dueServesAndRefreshesOnce() {
        var machine = lifecycle()
        let token = holding("a", &machine)
        let due = token.refreshAt + .seconds(1)
        let r5 = machine.demand(at: due)
        #expect(r5 == .serveAndRefresh(token, .init(refreshToken: nil, replacing: "a")))
        let r6 = machine.demand(at: due)
        #expect(r6 == .serve(token))
        let r7 = machine.demand(at: token.expiry)
        #expect(r7 == .join)
    }

    @Test("a failure with a valid token keeps serving it; without one callers are refused until the backoff ends")
    func failureBacksOff() {
        var machine = lifecycle()
        let token = holding("a", &machine)
        let due = token.refreshAt + .seconds(1)
        _ = machine.demand(at: due)
        let error = TokenEndpointError(.http(status: 500, oauthError: nil))
        let failed = machine.refreshEnded(.failure(error), started: due, at: due, jitter: 1)
        #expect(failed == .failed(error, delay: .milliseconds(500), retryAt: due + .milliseconds(500), still: token))
        // Backing off: the due token is served without another attempt.
        let r8 = machine.demand(at: due)
        #expect(r8 == .serve(token))
        // Expired, still backing off: refused at once.
        var cold = lifecycle()
        _ = cold.demand(at: t0)
        _ = cold.refreshEnded(.failure(error), started: t0, at: t0, jitter: 1)
        let r9 = cold.demand(at: t0 + .milliseconds(499))
        #expect(r9 == .refuse)
        let r10 = cold.demand(at: t0 + .milliseconds(500))
        #expect(r10 == .refresh(.init(refreshToken: nil, replacing: nil)))
        #expect(cold.failures == 1)
        #expect(cold.lastError == error)
    }

    @Test("backoff doubles to its cap with full jitter and never drops below the floor")
    func backoffCurve() {
        let backoff = TokenLifecycle.Backoff(base: .milliseconds(500), cap: .seconds(30), floor: .milliseconds(100))
        #expect(backoff.delay(afterFailures: 1, fraction: 1) == .milliseconds(500))
        #expect(backoff.delay(afterFailures: 3, fraction: 1) == .seconds(2))
        #expect(backoff.delay(afterFailures: 20, fraction: 1) == .seconds(30))
        #expect(backoff.delay(afterFailures: 64, fraction: 1) == .seconds(30))
        #expect(backoff.delay(afterFailures: 3, fraction: 0.5) == .seconds(1))
        #expect(backoff.delay(afterFailures: 3, fraction: 0) == .milliseconds(100))
        #expect(backoff.delay(afterFailures: 3, fraction: 7) == .seconds(2))
    }

    @Test("a success after failures clears the backoff")
    func successClearsFailures() {
        var machine = lifecycle()
        _ = machine.demand(at: t0)
        _ = machine.refreshEnded(.failure(TokenEndpointError(.timeout)), started: t0, at: t0, jitter: 1)
        let r11 = machine.backgroundDue()
        #expect(r11 == .refresh(.init(refreshToken: nil, replacing: nil)))
        _ = machine.refreshEnded(.success(TokenResponse(accessToken: "a")), started: t0, at: t0, jitter: 1)
        #expect(machine.failures == 0)
        #expect(machine.nextAttempt == nil)
        #expect(machine.lastError == nil)
    }

    @Test("invalidate drops only the token held, remembers it as replaced, and lets the next caller refresh at once")
    func invalidate() {
        var machine = lifecycle()
        let token = holding("a", &machine)
        machine.invalidate("stale")
        let r12 = machine.demand(at: t0)
        #expect(r12 == .serve(token))
        // Back off first: invalidation must lift it.
        _ = machine.demand(at: token.refreshAt)
        _ = machine.refreshEnded(.failure(TokenEndpointError(.timeout)), started: t0, at: token.refreshAt, jitter: 1)
        machine.invalidate("a")
        #expect(machine.token == nil)
        let r13 = machine.demand(at: token.refreshAt)
        #expect(r13 == .refresh(.init(refreshToken: nil, replacing: "a")))
    }

    @Test("the refresh grant sends the latest refresh token, rotated by each answer")
    func refreshTokenRotation() {
        var machine = lifecycle(refreshToken: "r1")
        let r14 = machine.demand(at: t0)
        #expect(r14 == .refresh(.init(refreshToken: "r1", replacing: nil)))
        _ = machine.refreshEnded(.success(TokenResponse(accessToken: "a", expiresIn: .seconds(10), refreshToken: "r2")),
                                 started: t0, at: t0, jitter: 1)
        let r15 = machine.demand(at: t0 + .seconds(11))
        #expect(r15 == .refresh(.init(refreshToken: "r2", replacing: "a")))
        _ = machine.refreshEnded(.success(TokenResponse(accessToken: "b", expiresIn: .seconds(10))),
                                 started: t0, at: t0, jitter: 1)
        #expect(machine.refreshToken == "r2")
    }

    @Test("after shutdown: callers are refused, the background timer does nothing, a refresh that ends is dropped")
    func shutDown() {
        var machine = lifecycle()
        _ = machine.demand(at: t0)
        let r16 = machine.shutDown()
        #expect(r16)
        let r17 = machine.demand(at: t0)
        #expect(r17 == .refuse)
        let r18 = machine.backgroundDue()
        #expect(r18 == .refuse)
        let r19 = machine.refreshEnded(.success(TokenResponse(accessToken: "a")), started: t0, at: t0, jitter: 1)
        #expect(r19 == .shutDown)
        #expect(machine.token == nil)
        var idle = lifecycle()
        let wasRefreshing = idle.shutDown()
        #expect(!wasRefreshing)
    }

    @Test("a background timer during a refresh joins it instead of starting another")
    func backgroundJoins() {
        var machine = lifecycle()
        _ = machine.demand(at: t0)
        let r20 = machine.backgroundDue()
        #expect(r20 == .join)
    }
}
