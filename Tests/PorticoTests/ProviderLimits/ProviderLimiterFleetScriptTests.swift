import HTTPTypes
@testable import Portico
import PorticoTesting
import RedisClient
import Testing

/// The fleet's budget script on a real `redis-server`, its clock moved ahead by a manual one:
/// the same guessing as `ProviderLimiter.Budget` (ProviderLimiterTests.guessFollowsTheRefusedWindow).
/// Holds of 60 s, so the real time a loaded machine takes between calls never reaches a window's end.
@Suite("Provider limits: the fleet's script guesses a silent provider's budget as the limiter does", .serialized,
       .enabled(if: RedisServer.available, "redis-server is not installed"))
struct ProviderLimiterFleetScriptTests {
    /// A `redis-server` of the test's own, the script on it for one scope (`k`), and the manual
    /// clock its runs are moved ahead by.
    final class Script {
        let redis: RedisServer
        let stores: RateLimitStores
        let backend: RedisBucketStore
        let clock = ManualClock()
        let fleet: RedisProviderBudgets

        init() async throws {
            redis = try await RedisServer.start()
            stores = try redis.fleetStores(timeout: .seconds(5))
            backend = try #require(stores.backend(named: "fleet"))
            let (clock, start) = (clock, clock.now)
            fleet = RedisProviderBudgets(backend: backend, upstream: "vendor", ahead: { start.duration(to: clock.now) })
        }

        func decide() async throws -> ProviderLimiter.Admission {
            try await fleet.decide("k", defaultHold: .seconds(1), at: clock.now)
        }

        /// The provider's answer to a request that went in `window`; a 429 holds 60 s.
        func answer(_ window: Int, _ status: Int) async throws {
            var fields = HTTPFields()
            if status == 429 { fields[.retryAfter] = "60" }
            try await fleet.observe("k", window: window, status: status,
                                    ProviderLimitHeaders.observe(fields, status: status, now: clock.wallNow), defaultHold: .seconds(1))
        }

        func stop() {
            let stores = stores
            Task { await stores.shutdown() }
            redis.stop()
        }
    }

    @Test("after a window with a refusal the guess is what the provider served in it (a 429 answered first, a late answer of an earlier window not counted), and reservations booked under the old guess do not all go")
    func guessFollowsTheRefusedWindow() async throws {
        let script = try await Script()
        defer { script.stop() }
        let (clock, fleet) = (script.clock, script.fleet)
        func limit() async throws -> Int? {
            let key = RedisProviderBudgets.hashName(prefix: script.backend.config.keyPrefix, upstream: "vendor", scope: "k")
            return try await script.backend.send(["HGET", .string(key), "limit"]).string.flatMap { Int($0) }
        }

        // Since the start: seven go, six are served, the seventh refused: a guess of six.
        for _ in 0..<7 { #expect(try await script.decide().isGo) }
        for _ in 0..<6 { try await script.answer(0, 200) }
        try await script.answer(0, 429)
        #expect(try await limit() == 6)
        #expect(try await script.decide().isGo == false, "held")
        clock.advance(by: .seconds(60))
        // Window 1: six go, six book window 2 under the guess of six.
        for _ in 0..<6 { #expect(try await script.decide() == .go(window: 1)) }
        for _ in 0..<6 { #expect(try await script.decide().window == 2) }
        // The provider served four of the six, and answered a 429 first; a straggler of window 0 comes too.
        try await script.answer(1, 429)
        for _ in 0..<4 { try await script.answer(1, 200) }
        try await script.answer(0, 200)
        try await script.answer(1, 429)
        #expect(try await limit() == 4, "served 4 of the 6 that went in window 1")
        clock.advance(by: .seconds(60))
        var went = 0, moved: [Int] = []
        for _ in 0..<6 {
            let admission = try await fleet.claim("k", window: 2, at: clock.now)
            if admission.isGo { went += 1 } else if let window = admission.window { moved.append(window) }
        }
        #expect(went == 4, "window 2 sent \(went) on a guess of 4")
        #expect(moved == [3, 3])
    }

    @Test("a count served whole and then refused is tried again once, after one full window at the lowered guess")
    func refusedCleanCountIsTriedAgain() async throws {
        let script = try await Script()
        defer { script.stop() }
        let (clock, fleet) = (script.clock, script.fleet)
        func went(_ count: Int, in window: Int) async throws {
            for _ in 0..<count { #expect(try await script.decide() == .go(window: window)) }
            let over = try await script.decide()
            #expect(over.isGo == false, "more than \(count) went in window \(window)")
            if let slot = over.window { try await fleet.release("k", window: slot) }
        }

        for _ in 0..<5 { #expect(try await script.decide().isGo) }
        for _ in 0..<4 { try await script.answer(0, 200) }
        try await script.answer(0, 429)
        clock.advance(by: .seconds(61))
        try await went(4, in: 1)
        for _ in 0..<4 { try await script.answer(1, 200) }
        clock.advance(by: .seconds(60))
        try await went(4, in: 2)
        try await script.answer(2, 200)
        for _ in 0..<3 { try await script.answer(2, 429) }
        clock.advance(by: .seconds(61))
        try await went(1, in: 3)
        try await script.answer(3, 200)
        clock.advance(by: .seconds(60))
        try await went(4, in: 4)
    }

    @Test("probes past a steady budget back off as the limiter's do: after 4, 8, then 16 full windows")
    func probesBackOff() async throws {
        let script = try await Script()
        defer { script.stop() }
        let (clock, fleet) = (script.clock, script.fleet)
        // A budget of 2, learned from a first window's refusal.
        for _ in 0..<3 { #expect(try await script.decide().isGo) }
        for _ in 0..<2 { try await script.answer(0, 200) }
        try await script.answer(0, 429)
        var probes: [Int] = []
        for window in 1...34 {
            clock.advance(by: .seconds(60))
            var went = 0
            while true {
                let admission = try await script.decide()
                guard admission.isGo else {
                    if let slot = admission.window { try await fleet.release("k", window: slot) }
                    break
                }
                went += 1
            }
            for n in 0..<went { try await script.answer(window, n < 2 ? 200 : 429) }
            if went > 2 {
                probes.append(window)
                clock.advance(by: .seconds(1))   // past the probe's hold
            }
        }
        #expect(probes == [5, 14, 31], "probed in windows \(probes)")
    }

    @Test("after a probe's refusal the window after the hold's keeps the old schedule")
    func probeKeepsTheSchedule() async throws {
        let script = try await Script()
        defer { script.stop() }
        let clock = script.clock

        for _ in 0..<3 { #expect(try await script.decide().isGo) }
        for _ in 0..<2 { try await script.answer(0, 200) }
        // The script's clock is the server's plus the manual one's advance, so the real time
        // between the refusal and the last `decide` (seconds, on a loaded machine) moves the
        // slot it names earlier on the manual clock by as much: bracketed from here.
        let realStart = ContinuousClock.now
        try await script.answer(0, 429)
        let refused = clock.now
        // Four full windows of 2 (60 s each), then a probe of 3 refused 6 s into window 5.
        for window in 1...4 {
            clock.advance(by: .seconds(60))
            for _ in 0..<2 { #expect(try await script.decide() == .go(window: window)) }
            for _ in 0..<2 { try await script.answer(window, 200) }
        }
        clock.advance(by: .seconds(60))
        for _ in 0..<3 { #expect(try await script.decide() == .go(window: 5)) }
        clock.advance(by: .seconds(6))
        for _ in 0..<2 { try await script.answer(5, 200) }
        try await script.answer(5, 429)
        clock.advance(by: .seconds(60))
        for _ in 0..<2 { #expect(try await script.decide() == .go(window: 6)) }
        // Window 7 begins 420 s after the first refusal (seven windows), not 426 (the probe's hold, then one).
        let next = try await script.decide()
        let realElapsed = realStart.duration(to: .now)
        #expect(next.window == 7)
        let expected = refused.advanced(by: .seconds(420))
        let slot = try #require(next.slot)
        #expect(slot > expected.advanced(by: .seconds(-1) - realElapsed) && slot < expected.advanced(by: .seconds(1)),
                "window 7 at \(refused.duration(to: slot)) after the first refusal, \(realElapsed) of real time meanwhile")
    }
}
