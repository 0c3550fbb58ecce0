import Foundation
import Testing
@testable import Portico
import PorticoTesting

@Suite("TokenManager", .timeLimit(.minutes(2)))
struct TokenManagerTests {
    @Test("1,000 concurrent callers without a token cause exactly one token call and share its token")
    func singleFlightCold() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            let results = await concurrentTokens(manager, count: 1_000)
            let tokens = Set(results.compactMap { try? $0.get() })
            #expect(tokens == ["tok-1"])
            #expect(results.count == 1_000)
            #expect(endpoint.callCount == 1)
            await manager.shutdown()
        }
    }

    @Test("at expiry, 1,000 concurrent callers share one refresh")
    func singleFlightAtExpiry() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, options: testOptions(proactive: false))
            #expect(try await manager.token().value == "tok-1")
            clock.advance(by: .seconds(3_600))
            let results = await concurrentTokens(manager, count: 1_000)
            #expect(Set(results.compactMap { try? $0.get() }) == ["tok-2"])
            #expect(results.allSatisfy { (try? $0.get()) != nil })
            #expect(endpoint.callCount == 2)
            await manager.shutdown()
        }
    }

    @Test("proactive refresh: callers keep the valid token without waiting, the endpoint sees one more call")
    func proactiveRefresh() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            // The refresh is held open below; the manager's timeout runs on the manual clock, but
            // URLSession's real-time backstop must outlast a loaded machine.
            let manager = makeManager(endpoint, clock: clock, refreshBeforeExpiry: .seconds(30), timeout: .seconds(120))
            let first = try await manager.token()
            #expect(first.value == "tok-1")
            #expect(first.refreshAt == first.expiry - .seconds(30))
            await clock.waitForSleepers(1)  // the background refresher
            // The refresh hangs: any caller that waited on it would never return.
            try await endpoint.setFailure(.hang)
            clock.advance(to: first.refreshAt + .seconds(1))
            let results = await concurrentTokens(manager, count: 1_000)
            #expect(Set(results.compactMap { try? $0.get() }) == ["tok-1"])
            #expect(results.allSatisfy { (try? $0.get()) != nil })
            try await endpoint.waitForHung(1)
            try await endpoint.setFailure(nil)  // answers the held refresh
            try await Eventually.wait { (try? await manager.token().value) == "tok-2" }
            #expect(endpoint.callCount == 2)
            await manager.shutdown()
        }
    }

    @Test("invalidating a token drops exactly that one, never a newer one")
    func invalidateExactToken() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            #expect(try await manager.token().value == "tok-1")
            await manager.invalidate(token: "tok-1")
            #expect(try await manager.token().value == "tok-2")
            await manager.invalidate(token: "tok-1")  // a late 401 for the old token
            #expect(try await manager.token().value == "tok-2")
            #expect(endpoint.callCount == 2)
            await manager.shutdown()
        }
    }

    @Test("without expires_in the token lives for the configured default lifetime")
    func defaultLifetime() async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.expiresIn = nil
        try await withEndpoint(configuration) { (endpoint) async throws in
            let clock = ManualClock()
            let start = clock.now
            let manager = makeManager(endpoint, clock: clock, refreshBeforeExpiry: .seconds(10),
                                      defaultLifetime: .seconds(120), options: testOptions(proactive: false))
            let token = try await manager.token()
            #expect(token.expiry == start + .seconds(120))
            clock.advance(by: .seconds(119))
            #expect(try await manager.token().value == "tok-1")
            clock.advance(by: .seconds(1))
            #expect(try await manager.token().value == "tok-2")
            await manager.shutdown()
        }
    }

    @Test("expires_in as a numeric string is honoured")
    func expiresInString() async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.expiresIn = 90
        configuration.expiresInAsString = true
        try await withEndpoint(configuration) { (endpoint) async throws in
            let clock = ManualClock()
            let start = clock.now
            let manager = makeManager(endpoint, clock: clock)
            #expect(try await manager.token().expiry == start + .seconds(90))
            await manager.shutdown()
        }
    }

    @Test("a token shorter-lived than refresh_before_expiry is refreshed at half its lifetime, not in a loop")
    func shortLivedToken() async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.expiresIn = 20
        try await withEndpoint(configuration) { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, refreshBeforeExpiry: .seconds(30))
            let token = try await manager.token()
            #expect(token.refreshAt == token.expiry - .seconds(10))
            #expect(endpoint.callCount == 1)
            await manager.shutdown()
        }
    }

    @Test("IdP answering 500 without a token: 503 at once for everyone, backoff grows to its cap, recovery")
    func serverErrorBackoffAndRecovery() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, options: testOptions(base: .seconds(1), cap: .seconds(4)))
            try await endpoint.setFailure(.status(500))

            let error = await gatewayError { _ = try await manager.token() }
            #expect(error?.code == "credentials_unavailable")
            #expect(error?.status == .serviceUnavailable)
            #expect(error?.message.contains("HTTP 500") == true)
            #expect(endpoint.callCount == 1)

            // Inside the backoff window nobody waits and nobody calls the IdP.
            let during = await concurrentTokens(manager, count: 200)
            #expect(during.allSatisfy(isCredentialsUnavailable))
            #expect(endpoint.callCount == 1)

            var delays: [Duration] = []
            var status = await manager.status
            delays.append(clock.now.duration(to: try #require(status.nextAttempt)))
            for attempt in 2...4 {
                // The background retry fires when the window ends.
                clock.advance(to: try #require(status.nextAttempt))
                try await endpoint.waitForCalls(attempt)
                try await Eventually.wait { await manager.status.consecutiveFailures == attempt }
                status = await manager.status
                delays.append(clock.now.duration(to: try #require(status.nextAttempt)))
                #expect(await concurrentTokens(manager, count: 50).allSatisfy(isCredentialsUnavailable))
                #expect(endpoint.callCount == attempt)
            }
            #expect(delays == [.seconds(1), .seconds(2), .seconds(4), .seconds(4)])

            try await endpoint.setFailure(nil)
            clock.advance(to: try #require(status.nextAttempt))
            try await Eventually.wait { await manager.status.hasToken }
            #expect(try await manager.token().value == "tok-1")
            #expect(await manager.status.consecutiveFailures == 0)
            #expect(endpoint.callCount == 5)
            await manager.shutdown()
        }
    }

    @Test("full jitter: the wait is the random fraction of the backoff ceiling, never below the floor",
          arguments: [(0.25, Duration.milliseconds(500)), (0, .milliseconds(100))])
    func jitter(fraction: Double, expected: Duration) async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, options: testOptions(base: .seconds(2), jitter: fraction))
            try await endpoint.setFailure(.status(503, error: "temporarily_unavailable"))
            _ = await gatewayError { _ = try await manager.token() }
            let next = try #require(await manager.status.nextAttempt)
            #expect(clock.now.duration(to: next) == expected)
            await manager.shutdown()
        }
    }

    @Test("while the IdP fails, a still-valid token keeps being served; once expired, 503 until it recovers")
    func staleWhileFailing() async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.expiresIn = 100
        try await withEndpoint(configuration) { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, refreshBeforeExpiry: .seconds(30))
            let first = try await manager.token()
            try await endpoint.setFailure(.status(500))

            clock.advance(to: first.refreshAt + .seconds(1))  // 71 s: the background refresh fails
            try await endpoint.waitForCalls(2)
            try await Eventually.wait { await manager.status.consecutiveFailures == 1 }
            let stillValid = await concurrentTokens(manager, count: 200)
            #expect(Set(stillValid.compactMap { try? $0.get() }) == ["tok-1"])
            #expect(stillValid.allSatisfy { (try? $0.get()) != nil })
            #expect(endpoint.callCount == 2)

            clock.advance(to: first.expiry + .seconds(1))  // the retry at 72 s fires late, fails again
            try await Eventually.wait { await manager.status.consecutiveFailures == 2 }
            #expect(await concurrentTokens(manager, count: 200).allSatisfy(isCredentialsUnavailable))
            #expect(endpoint.callCount == 3)

            try await endpoint.setFailure(nil)
            clock.advance(to: try #require(await manager.status.nextAttempt))
            try await Eventually.wait { await manager.status.hasToken }
            #expect(try await manager.token().value == "tok-2")
            await manager.shutdown()
        }
    }

    @Test("an IdP hanging past the credential timeout: the refresh gives up, later callers fail fast")
    func hangingIdP() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, timeout: .seconds(5))
            try await endpoint.setFailure(.hang)
            let waiting = Task { try await manager.token() }
            try await endpoint.waitForHung(1)
            clock.advance(by: .seconds(5))
            let error = await gatewayError { _ = try await waiting.value }
            #expect(error?.code == "credentials_unavailable")
            #expect(error?.message.contains("did not answer in time") == true)
            #expect(await concurrentTokens(manager, count: 100).allSatisfy(isCredentialsUnavailable))
            #expect(endpoint.callCount == 1)

            try await endpoint.setFailure(nil)
            clock.advance(to: try #require(await manager.status.nextAttempt))
            try await Eventually.wait { await manager.status.hasToken }
            let recovered = try await manager.token()
            #expect(endpoint.isCurrent(recovered.value))
            await manager.shutdown()
        }
    }

    @Test("garbage from the IdP is an error, not a crash", arguments: [
        "<html>this is not a token</html>", "", "[]", "{}", "{\"access_token\":42}", "{\"access_token\":\"\"}",
        "{\"access_token\":\"two words\"}", "{\"access_token\":\"a\",\"expires_in\":\"soon\"}",
        "{\"access_token\":\"a\",\"expires_in\":-5}", "{\"access_token\":\"a\",\"token_type\":7}",
        "{\"access_token\":\"a\",\"expires_in\":1e308}",
    ])
    func garbage(body: String) async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            try await endpoint.setFailure(.body(body))
            let error = await gatewayError { _ = try await manager.token() }
            #expect(error?.code == "credentials_unavailable")
            #expect(error?.message.contains("malformed") == true)
            #expect(await manager.status.hasToken == false)
            await manager.shutdown()
        }
    }

    @Test("an IdP that is down (closed port): 503 without a new attempt per caller, recovery when it listens again")
    func closedPort() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            try await endpoint.setFailure(.closed)
            let error = await gatewayError { _ = try await manager.token() }
            #expect(error?.code == "credentials_unavailable")
            #expect(error?.message.contains("unreachable") == true, "\(String(describing: error?.message))")
            #expect(await concurrentTokens(manager, count: 100).allSatisfy(isCredentialsUnavailable))
            // Each attempt counts a failure: still one attempt.
            #expect(await manager.status.consecutiveFailures == 1)

            try await endpoint.setFailure(nil)
            clock.advance(to: try #require(await manager.status.nextAttempt))
            try await Eventually.wait { await manager.status.hasToken }
            #expect(try await manager.token().value == "tok-1")
            await manager.shutdown()
        }
    }

    @Test("after shutdown the background refresher is gone and tokens are refused")
    func shutdown() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            _ = try await manager.token()
            await clock.waitForSleepers(1)
            await manager.shutdown()
            try await Eventually.wait { clock.sleeperCount == 0 }
            let error = await gatewayError { _ = try await manager.token() }
            #expect(error?.code == "credentials_unavailable")
        }
    }
}
