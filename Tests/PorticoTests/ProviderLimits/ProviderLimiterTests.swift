import HTTPTypes
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

@Suite("Provider limits: the learned budget holds back what the provider would refuse")
struct ProviderLimiterTests {
    let clock = ManualClock()

    func limiter(_ configure: (inout ProviderLimitsConfig) -> Void = { _ in }) -> ProviderLimiter {
        var config = ProviderLimitsConfig()
        config.maxWait = .seconds(5)
        configure(&config)
        return ProviderLimiter(upstream: "vendor", config: config, clock: clock)
    }

    func fields(_ pairs: [(String, String)]) -> HTTPFields {
        var fields = HTTPFields()
        for (name, value) in pairs { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        return fields
    }

    var context: RequestContext { RetryFixture.context(clock: clock) }

    @Test("after 'r remain until t', at most r more go before t, counting those in flight; the rest wait for t")
    func remainingIsSpent() async throws {
        let limits = limiter()
        try await limits.admit("", context: context)
        try await limits.admit("", context: context)          // two in flight
        limits.observe("", status: 200, fields: fields([("X-RateLimit-Remaining", "3"), ("X-RateLimit-Reset", "2")]))
        // 3 remain as of that answer, one other is still in flight: 2 more may go.
        try await limits.admit("", context: context)
        try await limits.admit("", context: context)
        #expect(limits.decide("", at: clock.now).isGo == false)
        let waiting = Task { try await limits.admit("", context: context) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .seconds(2)))
        clock.advance(by: .seconds(2))
        try await waiting.value
    }

    @Test("a wait past max_wait, or when_exhausted: reject, is 429 provider_exhausted at once with Retry-After")
    func refusedAtOnce() async throws {
        let patient = limiter { $0.maxWait = .seconds(1) }
        try await patient.admit("", context: context)
        patient.observe("", status: 200, fields: fields([("RateLimit", "\"default\";r=0;t=30")]))
        let error = await #expect(throws: GatewayError.self) { try await patient.admit("", context: context) }
        #expect(error?.code == "provider_exhausted")
        #expect(error?.status == .tooManyRequests)
        #expect(error?.headerFields[.retryAfter] == "30")
        #expect(clock.sleepsStarted == 0)

        let rejecting = limiter { $0.whenExhausted = .reject }
        try await rejecting.admit("", context: context)
        rejecting.observe("", status: 200, fields: fields([("RateLimit", "\"default\";r=0;t=1")]))
        await #expect(throws: GatewayError.self) { try await rejecting.admit("", context: context) }
        #expect(clock.sleepsStarted == 0)
    }

    @Test("a Retry-After holds the scope: nothing goes until then, even with budget left")
    func retryAfterHolds() async throws {
        let limits = limiter()
        try await limits.admit("", context: context)
        limits.observe("", status: 429, fields: fields([("Retry-After", "3"), ("X-RateLimit-Remaining", "10")]))
        #expect(limits.decide("", at: clock.now.advanced(by: .milliseconds(2999))).isGo == false)
        let waiting = Task { try await limits.admit("", context: context) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .seconds(3)))
        clock.advance(by: .seconds(3))
        try await waiting.value
    }

    @Test("after the reset the window's quota is the budget; a new window's count replaces the old")
    func resetRestoresQuota() async throws {
        let limits = limiter()
        try await limits.admit("", context: context)
        limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=0;t=1"), ("RateLimit-Policy", "\"s\";q=2;w=1")]))
        clock.advance(by: .seconds(1))
        #expect(limits.decide("", at: clock.now).isGo)
        #expect(limits.decide("", at: clock.now).isGo)
        #expect(limits.decide("", at: clock.now).isGo == false)
        // Answers from the new window: counts within it only go down.
        limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=1;t=1")]))
        limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=0;t=1")]))
        #expect(limits.decide("", at: clock.now).isGo == false)
    }

    @Test("with the quota known, requests beyond the budget get slots in the windows to come: first come, first served, at most the quota each")
    func slotsInLaterWindows() async throws {
        let limits = limiter { $0.maxWait = .seconds(10) }
        try await limits.admit("", context: context)
        limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=0;t=1"), ("RateLimit-Policy", "\"s\";q=2;w=1")]))
        let start = clock.now
        let slots = (0..<5).map { _ in limits.decide("", at: start) }
        let expected = [1, 1, 2, 2, 3].map { ProviderLimiter.Admission.reserved(start.advanced(by: .seconds($0))) }
        #expect(slots.map(\.slot) == expected.map(\.slot))
        // Too far for max_wait: refused at once, and its slot is given back.
        let impatient = limiter { $0.maxWait = .milliseconds(500) }
        try await impatient.admit("", context: context)
        impatient.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=0;t=1"), ("RateLimit-Policy", "\"s\";q=2;w=1")]))
        await #expect(throws: GatewayError.self) { try await impatient.admit("", context: context) }
        #expect(impatient.decide("", at: clock.now).slot == clock.now.advanced(by: .seconds(1)))
    }

    @Test("scopes are separate: one API key's spent budget does not hold another's")
    func separateScopes() async throws {
        let limits = limiter { $0.scope = .header("x-api-key") }
        try await limits.admit("a", context: context)
        limits.observe("a", status: 200, fields: fields([("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "60")]))
        #expect(limits.decide("a", at: clock.now).isGo == false)
        #expect(limits.decide("b", at: clock.now).isGo)
        // The admin report never shows the key itself.
        #expect(limits.report().allSatisfy { $0.scope.hasPrefix("#") })
    }

    @Test("a provider that says nothing is not held back")
    func silentProvider() async throws {
        let limits = limiter()
        for _ in 0..<100 {
            try await limits.admit("", context: context)
            limits.observe("", status: 200, fields: HTTPFields())
        }
        #expect(clock.sleepsStarted == 0)
    }

    @Test("the scope table stays within max_scopes")
    func boundedScopes() async throws {
        let limits = limiter { $0.maxScopes = 64 }
        for i in 0..<10_000 {
            try await limits.admit("k\(i)", context: context)
            limits.observe("k\(i)", status: 200, fields: fields([("X-RateLimit-Remaining", "5")]))
        }
        #expect(limits.report().count <= 64)
    }
}

extension ProviderLimiter.Admission {
    var isGo: Bool { if case .go = self { true } else { false } }
    var slot: ContinuousClock.Instant? { if case .reserved(let instant) = self { instant } else { nil } }
}
