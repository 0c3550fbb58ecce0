import Foundation
import Metrics
import MetricsTestKit
import Synchronization
import Testing
@testable import Portico
import PorticoTesting

/// A token source that answers from a script: a token, or a failure.
final class ScriptedTokenSource: TokenSource {
    let failing = Atomic<Bool>(false)
    let calls = Atomic<Int>(0)

    func fetch(refreshToken: String?) async throws(TokenEndpointError) -> TokenResponse {
        let call = calls.add(1, ordering: .relaxed).newValue
        if failing.load(ordering: .relaxed) { throw TokenEndpointError(.transport("connection refused")) }
        return TokenResponse(accessToken: "secret-token-\(call)", expiresIn: .seconds(60))
    }

    func shutdown() {}
}

@Suite("GET /credentials")
struct CredentialReportTests {
    @Test("a held token counts down on the clock; a failed refresh shows its error, the failures and the next attempt")
    func countdownAndFailure() async throws {
        let clock = ManualClock()
        let source = ScriptedTokenSource()
        let manager = TokenManager(name: "idp", source: source, clock: clock, refreshBeforeExpiry: .seconds(10),
                                   defaultLifetime: .seconds(60), timeout: .seconds(5),
                                   options: testOptions(proactive: false, base: .seconds(4), cap: .seconds(4)), logger: quietLogger)
        let now = Date()
        var entry = CredentialReport.entry(name: "idp", kind: "oauth2_client_credentials", status: await manager.status, now: now)
        #expect(!entry.hasToken && entry.lastRefresh == nil && entry.expiresInSeconds == nil)

        _ = try await manager.token()
        clock.advance(by: .seconds(15))
        entry = CredentialReport.entry(name: "idp", kind: "oauth2_client_credentials", status: await manager.status, now: now)
        #expect(entry.hasToken && entry.expiresInSeconds == 45)
        #expect(entry.lastRefresh?.ok == true && entry.lastRefresh?.secondsAgo == 15 && entry.lastRefresh?.error == nil)
        clock.advance(by: .seconds(20))
        entry = CredentialReport.entry(name: "idp", kind: "oauth2_client_credentials", status: await manager.status, now: now)
        #expect(entry.expiresInSeconds == 25)

        // The gauge is recorded from the report, so it follows the countdown at each scrape.
        let metrics = TestMetrics()
        CredentialReport(credentials: [entry]).recordExpiryGauges(factory: metrics)
        #expect(try metrics.expectGauge("portico_token_expiry_seconds", [("credential", "idp")]).lastValue == 25)

        source.failing.store(true, ordering: .relaxed)
        await manager.invalidate(token: "secret-token-1")
        await #expect(throws: GatewayError.self) { try await manager.token() }
        clock.advance(by: .seconds(1))
        entry = CredentialReport.entry(name: "idp", kind: "oauth2_client_credentials", status: await manager.status, now: now)
        #expect(!entry.hasToken && entry.consecutiveFailures == 1)
        #expect(entry.lastRefresh?.ok == false && entry.lastRefresh?.secondsAgo == 1)
        #expect(entry.lastRefresh?.error == "token endpoint unreachable: connection refused")
        #expect(entry.nextAttemptInSeconds == 3)
        let json = String(decoding: AdminJSON.encode(CredentialReport(credentials: [entry])), as: UTF8.self)
        #expect(json.contains("\"consecutive_failures\":1") && json.contains("\"next_attempt_in_seconds\":3"))
        #expect(!json.contains("secret-token"))
        await manager.shutdown()
    }

    @Test("every credential of a runtime is listed with its kind; fixed ones always hold a value")
    func collect() async throws {
        let config = try load("""
            credentials:
              key: { type: static, value: not-shown-anywhere }
              login: { type: basic, username: u, password: p4ss }
              idp: { type: oauth2_client_credentials, token_url: "http://127.0.0.1:1/token", client_id: c, client_secret: s3cr3t }

            """ + minimalRoute)
        let runtime = try GatewayRuntime(config: config, logger: quietLogger)
        let report = await CredentialReport.collect(from: runtime)
        #expect(report.credentials.map(\.name) == ["idp", "key", "login"])
        #expect(report.credentials.map(\.kind) == ["oauth2_client_credentials", "static", "basic"])
        #expect(report.credentials.map(\.hasToken) == [false, true, true])
        let json = String(decoding: AdminJSON.encode(report), as: UTF8.self)
        for secret in ["not-shown-anywhere", "p4ss", "s3cr3t"] { #expect(!json.contains(secret)) }
        await runtime.shutdown()
    }
}
