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

    /// A limiter whose provider said: none left in this one-second window, two in each.
    func spentWithQuotaOfTwo(maxWait: Duration) async throws -> ProviderLimiter {
        let limits = limiter { $0.maxWait = maxWait }
        try await limits.admit("", context: context)
        await limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=0;t=1"), ("RateLimit-Policy", "\"s\";q=2;w=1")]))
        return limits
    }

    @Test("after 'r remain until t', at most r more go before t, counting those in flight; the rest wait for t")
    func remainingIsSpent() async throws {
        let limits = limiter()
        try await limits.admit("", context: context)
        try await limits.admit("", context: context)          // two in flight
        await limits.observe("", status: 200, fields: fields([("X-RateLimit-Remaining", "3"), ("X-RateLimit-Reset", "2")]))
        // 3 remain as of that answer, one other is still in flight: 2 more may go.
        try await limits.admit("", context: context)
        try await limits.admit("", context: context)
        #expect(limits.decide("", at: clock.now).isGo == false)
        let waiting = Task { try await limits.admit("", context: context) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .seconds(2)))
        clock.advance(by: .seconds(2))
        _ = try await waiting.value
    }

    @Test("a wait past max_wait, or when_exhausted: reject, is 429 provider_exhausted at once with Retry-After")
    func refusedAtOnce() async throws {
        let patient = limiter { $0.maxWait = .seconds(1) }
        try await patient.admit("", context: context)
        await patient.observe("", status: 200, fields: fields([("RateLimit", "\"default\";r=0;t=30")]))
        let error = await #expect(throws: GatewayError.self) { try await patient.admit("", context: context) }
        #expect(error?.code == "provider_exhausted")
        #expect(error?.status == .tooManyRequests)
        #expect(error?.headerFields[.retryAfter] == "30")
        #expect(clock.sleepsStarted == 0)

        let rejecting = limiter { $0.whenExhausted = .reject }
        try await rejecting.admit("", context: context)
        await rejecting.observe("", status: 200, fields: fields([("RateLimit", "\"default\";r=0;t=1")]))
        await #expect(throws: GatewayError.self) { try await rejecting.admit("", context: context) }
        #expect(clock.sleepsStarted == 0)
    }

    @Test("a Retry-After holds the scope: nothing goes until then, even with budget left")
    func retryAfterHolds() async throws {
        let limits = limiter()
        try await limits.admit("", context: context)
        await limits.observe("", status: 429, fields: fields([("Retry-After", "3"), ("X-RateLimit-Remaining", "10")]))
        #expect(limits.decide("", at: clock.now.advanced(by: .milliseconds(2999))).isGo == false)
        let waiting = Task { try await limits.admit("", context: context) }
        await clock.waitForSleepers(1)
        #expect(clock.nextDeadline == clock.now.advanced(by: .seconds(3)))
        clock.advance(by: .seconds(3))
        _ = try await waiting.value
    }

    @Test("after the reset the window's quota is the budget; a new window's count replaces the old")
    func resetRestoresQuota() async throws {
        let limits = limiter()
        try await limits.admit("", context: context)
        await limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=0;t=1"), ("RateLimit-Policy", "\"s\";q=2;w=1")]))
        clock.advance(by: .seconds(1))
        #expect(limits.decide("", at: clock.now).isGo)
        #expect(limits.decide("", at: clock.now).isGo)
        #expect(limits.decide("", at: clock.now).isGo == false)
        // Answers from the new window: counts within it only go down.
        await limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=1;t=1")]))
        await limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=0;t=1")]))
        #expect(limits.decide("", at: clock.now).isGo == false)
    }

    @Test("with the quota known, requests beyond the budget get slots in the windows to come: first come, first served, at most the quota each")
    func slotsInLaterWindows() async throws {
        let limits = try await spentWithQuotaOfTwo(maxWait: .seconds(10))
        let start = clock.now
        let slots = (0..<5).map { _ in limits.decide("", at: start) }
        let expected = [1, 1, 2, 2, 3].map { ProviderLimiter.Admission.reserved(at: start.advanced(by: .seconds($0)), window: $0) }
        #expect(slots == expected)
        // Too far for max_wait: refused at once, and its slot is given back.
        let impatient = try await spentWithQuotaOfTwo(maxWait: .milliseconds(500))
        await #expect(throws: GatewayError.self) { try await impatient.admit("", context: context) }
        #expect(impatient.decide("", at: clock.now).slot == clock.now.advanced(by: .seconds(1)))
    }

    @Test("a reservation holds a window, not an instant: when answers move the reset later, a waiter that wakes early waits again and none goes before the provider's window")
    func reservationsFollowTheReset() async throws {
        let limits = try await spentWithQuotaOfTwo(maxWait: .seconds(10))
        let start = clock.now
        let first = limits.decide("", at: start), second = limits.decide("", at: start), third = limits.decide("", at: start)
        #expect(first == .reserved(at: start.advanced(by: .seconds(1)), window: 1))
        #expect(third == .reserved(at: start.advanced(by: .seconds(2)), window: 2))
        // A late answer of the same window: its reset is 600 ms later than first thought.
        clock.advance(by: .milliseconds(600))
        await limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=0;t=1")]))
        // The first waiter wakes at the first estimate: its window has not begun; it waits again.
        clock.advance(by: .milliseconds(400))
        #expect(limits.claim("", window: 1, at: clock.now) == .reserved(at: start.advanced(by: .milliseconds(1600)), window: 1))
        #expect(limits.decide("", at: clock.now).window == 2, "a newcomer takes window 2's second slot")
        // The window begins: both of its reservations go, and nothing else does.
        clock.advance(by: .milliseconds(600))
        #expect(limits.claim("", window: 1, at: clock.now).isGo)
        #expect(limits.claim("", window: 1, at: clock.now).isGo)
        #expect(limits.claim("", window: 2, at: clock.now).window == 2, "window 2 has not begun")
        #expect(limits.decide("", at: clock.now).window == 3)
        #expect(second == first)
    }

    @Test("a window's due reservations are its first: an arrival, or a count the provider took before they went, cannot spend their slots")
    func dueReservationsComeFirst() async throws {
        let limits = try await spentWithQuotaOfTwo(maxWait: .seconds(10))
        #expect(limits.decide("", at: clock.now).window == 1)
        #expect(limits.decide("", at: clock.now).window == 1)
        clock.advance(by: .seconds(1))
        // Window 1 began; its two slots are the waiters', who have not claimed them yet.
        #expect(limits.decide("", at: clock.now).window == 2)
        // Answers in the new window (one says a later window already) count 2 remaining: the
        // two due ones are not in those counts yet, so nothing is left for anyone else.
        await limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=2;t=1")]))
        #expect(limits.decide("", at: clock.now).window == 2)
        await limits.observe("", status: 200, fields: fields([("RateLimit", "\"s\";r=2;t=3")]))
        #expect(limits.decide("", at: clock.now).window == 3, "window 2 began early: its slots are due too")
        #expect(limits.claim("", window: 1, at: clock.now).isGo)
        #expect(limits.claim("", window: 1, at: clock.now).isGo)
        #expect(limits.claim("", window: 2, at: clock.now).isGo)
        // A reservation given up once its window began is that window's budget again.
        limits.release("", window: 2)
        #expect(limits.decide("", at: clock.now).isGo)
        #expect(limits.decide("", at: clock.now).isGo == false)
    }

    @Test("a provider that sends only Retry-After: its budget is guessed from what it served in the window it refused in, so after a hold one window's worth goes and the rest take slots")
    func retryAfterOnlyBudgetIsGuessed() async throws {
        let limits = limiter { $0.maxWait = .seconds(10) }
        // Nothing said: three go and are served; the fourth is refused with Retry-After: 1.
        for _ in 0..<4 { #expect(limits.decide("", at: clock.now).isGo) }
        for _ in 0..<3 { await limits.observe("", status: 200, fields: HTTPFields()) }
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        let holdEnd = clock.now.advanced(by: .seconds(1))
        #expect(limits.decide("", at: clock.now) == .waitUntil(holdEnd))
        // After the hold: three go (the guess), the next ones take slots in the windows after.
        clock.advance(by: .seconds(1))
        for _ in 0..<3 { #expect(limits.decide("", at: clock.now).isGo) }
        #expect(limits.decide("", at: clock.now) == .reserved(at: holdEnd.advanced(by: .seconds(1)), window: 2))
        limits.release("", window: 2)
        for _ in 0..<3 { await limits.observe("", status: 200, fields: HTTPFields()) }
        // Four windows in a row filled without a refusal raise the guess by one.
        for _ in 0..<3 {
            clock.advance(by: .seconds(1))
            for _ in 0..<3 { #expect(limits.decide("", at: clock.now).isGo) }
            let over = limits.decide("", at: clock.now)
            #expect(over.isGo == false)
            if let window = over.window { limits.release("", window: window) }
            for _ in 0..<3 { await limits.observe("", status: 200, fields: HTTPFields()) }
        }
        clock.advance(by: .seconds(1))
        for _ in 0..<4 { #expect(limits.decide("", at: clock.now).isGo) }
        if let window = limits.decide("", at: clock.now).window { limits.release("", window: window) } else { Issue.record("a fifth went") }
        // Answers of requests on their way when it refused still count: 4 sent, the provider
        // refuses the first answered, then serves the three others.
        for _ in 0..<3 { await limits.observe("", status: 200, fields: HTTPFields()) }
        clock.advance(by: .seconds(1))
        for _ in 0..<4 { #expect(limits.decide("", at: clock.now).isGo) }
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        for _ in 0..<3 { await limits.observe("", status: 200, fields: HTTPFields()) }
        #expect(limits.report().first?.limit == 3, "what it served in the window it refused in (all 3 answered after the 429), not more than the 4 sent")
        // A provider that states its limit replaces the guess.
        await limits.observe("", status: 200, fields: fields([("X-RateLimit-Limit", "50"), ("X-RateLimit-Remaining", "40")]))
        #expect(limits.report().first?.limit == 50)
    }

    /// The first guess spans the start, which may straddle two of the provider's windows: too
    /// high. The next window sends it, the provider serves its real budget and refuses the rest;
    /// the guess is then what was served in that window, even when a 429 is the first answer, and
    /// the reservations booked under the old guess no longer fit: the windows after send the new
    /// guess, not the old one.
    @Test("after a window with a refusal the guess is what the provider served in it, and no later window sends more, whatever was booked under the old guess")
    func guessFollowsTheRefusedWindow() async throws {
        let limits = limiter { $0.maxWait = .seconds(10) }
        for _ in 0..<7 { #expect(limits.decide("", at: clock.now).isGo) }
        for _ in 0..<6 { await limits.observe("", status: 200, fields: HTTPFields()) }
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        #expect(limits.report().first?.limit == 6)
        clock.advance(by: .seconds(1))
        // Window 1: six go, the next six book window 2 (under a guess of six).
        for _ in 0..<6 { #expect(limits.decide("", at: clock.now).isGo) }
        for _ in 0..<6 { #expect(limits.decide("", at: clock.now).window == 2) }
        // The provider served four of the six: its first answer is a 429.
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        for _ in 0..<4 { await limits.observe("", status: 200, fields: HTTPFields()) }
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        #expect(limits.report().first?.limit == 4, "served 4 of 6 in the window it refused in")
        clock.advance(by: .seconds(1))
        // Window 2: four of its six reservations go; the other two move to window 3.
        var went = 0, moved: [Int] = []
        for _ in 0..<6 {
            let admission = limits.claim("", window: 2, at: clock.now)
            if admission.isGo { went += 1 } else if let window = admission.window { moved.append(window) }
        }
        #expect(went == 4, "window 2 sent \(went) on a guess of 4")
        #expect(moved == [3, 3])
        let over = limits.decide("", at: clock.now)
        #expect(over.isGo == false)
        if let window = over.window { limits.release("", window: window) }
        for _ in 0..<4 { await limits.observe("", status: 200, fields: HTTPFields()) }
        // Window 3: the two moved first, then two newcomers; nothing more.
        clock.advance(by: .seconds(1))
        for _ in 0..<2 { #expect(limits.claim("", window: 3, at: clock.now).isGo) }
        for _ in 0..<2 { #expect(limits.decide("", at: clock.now).isGo) }
        #expect(limits.decide("", at: clock.now).isGo == false)
    }

    /// The provider says nothing of when its window begins: a window of ours that begins just
    /// before one of its own sends a burst whose tail it counts in its next window, and our next
    /// window, sending the same count, meets a refusal. The guess is what that window got (per
    /// the rule above), but the count served whole before is tried again once, and our windows
    /// move past the provider's start by the burst's length.
    @Test("a count served whole and then refused: the next window begins a burst's length after the hold, and after one full window at the lowered guess the old count is tried again, once")
    func refusedCleanCountIsTriedAgain() async throws {
        let limits = limiter { $0.maxWait = .seconds(10) }
        for _ in 0..<5 { #expect(limits.decide("", at: clock.now).isGo) }
        for _ in 0..<4 { await limits.observe("", status: 200, fields: HTTPFields()) }
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        clock.advance(by: .seconds(1))
        // Window 1 sends the guess of 4, all served.
        for _ in 0..<4 { #expect(limits.decide("", at: clock.now).isGo) }
        for _ in 0..<4 { await limits.observe("", status: 200, fields: HTTPFields()) }
        // Window 2's burst takes 150 ms to leave; the provider serves one and refuses three.
        clock.advance(by: .seconds(1))
        for index in 0..<4 {
            if index > 0 { clock.advance(by: .milliseconds(50)) }
            #expect(limits.decide("", at: clock.now).isGo)
        }
        await limits.observe("", status: 200, fields: HTTPFields())
        for _ in 0..<3 { await limits.observe("", status: 429, fields: fields([("Retry-After", "1")])) }
        #expect(limits.report().first?.limit == 1)
        let holdEnd = clock.now.advanced(by: .seconds(1))
        let over = limits.decide("", at: holdEnd)
        #expect(over == .reserved(at: holdEnd.advanced(by: .milliseconds(150)), window: 3))
        if let window = over.window { limits.release("", window: window) }
        // Window 3 sends the lowered guess; window 4 the count served whole before.
        clock.advance(by: .milliseconds(1150))
        #expect(limits.decide("", at: clock.now).isGo)
        #expect(limits.decide("", at: clock.now).isGo == false)
        limits.release("", window: 4)
        await limits.observe("", status: 200, fields: HTTPFields())
        clock.advance(by: .seconds(1))
        for _ in 0..<4 { #expect(limits.decide("", at: clock.now).isGo) }
        #expect(limits.decide("", at: clock.now).isGo == false)
        limits.release("", window: 5)
        // Refused again at that count: the provider did lower its budget; it is not tried a third time.
        await limits.observe("", status: 200, fields: HTTPFields())
        for _ in 0..<3 { await limits.observe("", status: 429, fields: fields([("Retry-After", "1")])) }
        #expect(limits.report().first?.limit == 1)
        for window in 5...6 {
            clock.advance(by: .seconds(1))
            #expect(limits.decide("", at: clock.now).isGo)
            #expect(limits.decide("", at: clock.now).isGo == false, "window \(window)")
            limits.release("", window: window + 1)
            await limits.observe("", status: 200, fields: HTTPFields())
        }
    }

    /// A probe's refusal comes at its burst's end, so the hold ends that long after the window's
    /// own end: following it, each probe would move our windows later by a burst's length, until
    /// one began just before the provider's and its burst spanned two of the provider's windows.
    @Test("after a probe's refusal the window after the hold's keeps the old schedule: a probe does not move the windows later")
    func probeKeepsTheSchedule() async throws {
        let limits = limiter { $0.maxWait = .seconds(10) }
        for _ in 0..<3 { #expect(limits.decide("", at: clock.now).isGo) }
        for _ in 0..<2 { await limits.observe("", status: 200, fields: HTTPFields()) }
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        let windowStart = clock.now.advanced(by: .seconds(1))
        // Four full windows of 2, then a probe of 3 whose last is refused 100 ms into its window.
        for _ in 0..<4 {
            clock.advance(by: .seconds(1))
            for _ in 0..<2 { #expect(limits.decide("", at: clock.now).isGo) }
            for _ in 0..<2 { await limits.observe("", status: 200, fields: HTTPFields()) }
        }
        clock.advance(by: .seconds(1))
        let probe = clock.now
        #expect(probe == windowStart.advanced(by: .seconds(4)))
        for _ in 0..<3 { #expect(limits.decide("", at: clock.now).isGo) }
        clock.advance(by: .milliseconds(100))
        for _ in 0..<2 { await limits.observe("", status: 200, fields: HTTPFields()) }
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        #expect(limits.report().first?.limit == 2)
        // The hold's window begins when the hold ends (1.1 s after the probe's began); the one
        // after it 2 s after, as if there had been no probe.
        clock.advance(by: .seconds(1))
        for _ in 0..<2 { #expect(limits.decide("", at: clock.now).isGo) }
        #expect(limits.decide("", at: clock.now) == .reserved(at: probe.advanced(by: .seconds(2)), window: 7))
        #expect(limits.decide("", at: clock.now) == .reserved(at: probe.advanced(by: .seconds(2)), window: 7))
        #expect(limits.decide("", at: clock.now) == .reserved(at: probe.advanced(by: .seconds(3)), window: 8))
    }

    /// A probe past the real budget costs one refusal, the one that starts the hold: a guess of
    /// 20 grows to 21, not 22, so no second request of the probe reaches a paused provider.
    @Test("a guessed budget grows by one request, not by a share, after four windows filled without a refusal")
    func guessGrowsByOne() async throws {
        let limits = limiter { $0.maxWait = .seconds(10) }
        for _ in 0..<21 { #expect(limits.decide("", at: clock.now).isGo) }
        for _ in 0..<20 { await limits.observe("", status: 200, fields: HTTPFields()) }
        await limits.observe("", status: 429, fields: fields([("Retry-After", "1")]))
        #expect(limits.report().first?.limit == 20)
        for round in 0..<5 {
            clock.advance(by: .seconds(1))
            let allowed = round < 4 ? 20 : 21
            for _ in 0..<allowed { #expect(limits.decide("", at: clock.now).isGo, "round \(round)") }
            let over = limits.decide("", at: clock.now)
            #expect(over.isGo == false, "round \(round): one more than \(allowed) went")
            if let window = over.window { limits.release("", window: window) }
            for _ in 0..<allowed { await limits.observe("", status: 200, fields: HTTPFields()) }
        }
        #expect(limits.report().first?.limit == 21)
    }

    @Test("scopes are separate: one API key's spent budget does not hold another's")
    func separateScopes() async throws {
        let limits = limiter { $0.scope = .header("x-api-key") }
        try await limits.admit("a", context: context)
        await limits.observe("a", status: 200, fields: fields([("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "60")]))
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
            await limits.observe("", status: 200, fields: HTTPFields())
        }
        #expect(clock.sleepsStarted == 0)
    }

    @Test("the scope table stays within max_scopes")
    func boundedScopes() async throws {
        let limits = limiter { $0.maxScopes = 64 }
        for i in 0..<10_000 {
            try await limits.admit("k\(i)", context: context)
            await limits.observe("k\(i)", status: 200, fields: fields([("X-RateLimit-Remaining", "5")]))
        }
        #expect(limits.report().count <= 64)
    }
}

extension ProviderLimiter.Admission {
    var isGo: Bool { if case .go = self { true } else { false } }
    var slot: ContinuousClock.Instant? { if case .reserved(let instant, _) = self { instant } else { nil } }
    var window: Int? { if case .reserved(_, let window) = self { window } else { nil } }
}

/// Drives a limiter on the manual clock as 60 callers a second for 20 s would (1,200 steps):
/// each step delivers the answers due, wakes the waiters whose time came (one holding a reserved
/// slot claims it, the others ask again), then a new request arrives. A request whose wait would
/// pass `maxWait` is refused here; one that goes reaches `provider`, which answers with the status
/// and fields the limiter hears `delay` steps later. The limiter: `max_wait: 5s`, one scope.
struct ProviderSimulation {
    typealias Answer = (delay: Int, status: Int, fields: HTTPFields)

    let clock = ManualClock()
    let maxWait = Duration.seconds(5)
    let limits: ProviderLimiter
    let t0: ContinuousClock.Instant

    init() {
        var config = ProviderLimitsConfig()
        config.maxWait = maxWait
        limits = ProviderLimiter(upstream: "vendor", config: config, clock: clock)
        t0 = clock.now
    }

    /// Seconds since the start, on the manual clock.
    var seconds: Double {
        let elapsed = t0.duration(to: clock.now)
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }

    /// Offers 60 a second for `seconds`; returns how many requests the limiter refused (their
    /// wait past `maxWait`).
    func run(seconds: Int = 20, provider: () -> Answer) async -> Int {
        let clock = clock, limits = limits, maxWait = maxWait
        var refusedHere = 0
        // Waiters: when they wake, and whether they hold a reserved slot (else they ask again).
        var waiters: [(at: ContinuousClock.Instant, window: Int?, arrived: ContinuousClock.Instant)] = []
        var answers: [(due: Int, status: Int, fields: HTTPFields)] = []
        var stepIndex = 0
        func handle(_ admission: ProviderLimiter.Admission, arrived: ContinuousClock.Instant) {
            let now = clock.now
            let left = maxWait - arrived.duration(to: now)
            switch admission {
            case .go:
                let answer = provider()
                answers.append((stepIndex + answer.delay, answer.status, answer.fields))
            case .waitUntil(let instant):
                if now.duration(to: instant) > left { refusedHere += 1 } else { waiters.append((instant, nil, arrived)) }
            case .reserved(let instant, let window):
                if now.duration(to: instant) > left {
                    limits.release("", window: window)
                    refusedHere += 1
                } else {
                    waiters.append((instant, window, arrived))
                }
            }
        }

        let step = Duration.nanoseconds(16_666_667)   // 60 a second
        for index in 0..<(seconds * 60) {
            stepIndex = index
            for answer in answers where answer.due <= index {
                await limits.observe("", status: answer.status, fields: answer.fields)
            }
            answers.removeAll { $0.due <= index }
            let now = clock.now
            let due = waiters.filter { $0.at <= now }
            waiters.removeAll { $0.at <= now }
            for waiter in due.sorted(by: { $0.at < $1.at }) {
                let admission = if let window = waiter.window { limits.claim("", window: window, at: now) } else { limits.decide("", at: now) }
                handle(admission, arrived: waiter.arrived)
            }
            handle(limits.decide("", at: now), arrived: now)
            clock.advance(by: step)
        }
        return refusedHere
    }
}

/// The limiter against a simulated provider on the manual clock: 20 a second in fixed windows,
/// its remaining count and `t` (whole seconds, rounded up) on every answer, offered 60 a second
/// for 20 s — the issue's goals for one replica.
@Suite("Provider limits: a simulated overload")
struct ProviderLimiterSimulationTests {
    @Test("offered three times what the provider allows: it serves at least 90 % of what it allows and refuses at most 1 % of what is forwarded")
    func overload() async throws {
        let simulation = ProviderSimulation()
        let quota = 20
        var windowIndex = -1, used = 0
        var served = 0, refusedByProvider = 0
        // Answers reach the limiter 3 steps after the provider counted the request.
        let refusedHere = await simulation.run {
            let seconds = simulation.seconds
            let window = Int(seconds.rounded(.down))
            if window != windowIndex { windowIndex = window; used = 0 }
            used += 1
            let resetIn = Int((Double(window + 1) - seconds).rounded(.up))
            var fields = HTTPFields()
            fields.append(HTTPField(name: HTTPField.Name("RateLimit-Policy")!, value: "\"s\";q=\(quota);w=1"))
            if used <= quota {
                served += 1
                fields.append(HTTPField(name: HTTPField.Name("RateLimit")!, value: "\"s\";r=\(quota - used);t=\(max(1, resetIn))"))
                return (3, 200, fields)
            }
            refusedByProvider += 1
            fields.append(HTTPField(name: HTTPField.Name("RateLimit")!, value: "\"s\";r=0;t=\(max(1, resetIn))"))
            fields.append(HTTPField(name: .retryAfter, value: String(max(1, resetIn))))
            return (3, 429, fields)
        }
        let allowed = 20 * quota
        let forwarded = served + refusedByProvider
        print("simulation: served \(served) of \(allowed), provider refused \(refusedByProvider), refused here \(refusedHere)")
        #expect(Double(served) >= 0.9 * Double(allowed), "served \(served) of \(allowed); refused here \(refusedHere)")
        #expect(Double(refusedByProvider) <= 0.01 * Double(forwarded), "the provider refused \(refusedByProvider) of \(forwarded)")
    }
}

/// The limiter against a simulated provider that sends only `Retry-After` (whole seconds to the
/// end of its window, at least 1): 20 a second in windows aligned on its own clock, the load
/// beginning 0.7 s into one (so the first guess, served since the start, spans two of them and
/// is too high), offered 60 a second for 20 s. It answers a refusal sooner than a success, so
/// the limiter hears a window's 429 before its 200s.
@Suite("Provider limits: a simulated overload of a provider that sends only Retry-After")
struct ProviderLimiterRetryAfterSimulationTests {
    @Test("the guess comes down in one refusal; after it no window gets more than the budget and one probe, and nothing reaches the provider late in a hold")
    func retryAfterOnlyOverload() async throws {
        let simulation = ProviderSimulation()
        let quota = 20, offset = 0.7
        var arrivals: [Int: Int] = [:], refusals: [Int: Int] = [:]   // by the provider's window
        var holdBegan = -1.0, holdUntil = -1.0, lateInHold = 0
        let refusedHere = await simulation.run {
            let now = simulation.seconds + offset
            let window = Int(now.rounded(.down))
            // As bench/pace-provider.py counts `during_hold_late`: 100 ms or more into a hold.
            if now < holdUntil, now - holdBegan >= 0.1 { lateInHold += 1 }
            arrivals[window, default: 0] += 1
            guard arrivals[window, default: 0] > quota else { return (3, 200, HTTPFields()) }
            refusals[window, default: 0] += 1
            let retry = max(1, Int((Double(window + 1) - now).rounded(.up)))
            if now >= holdUntil { holdBegan = now }
            holdUntil = max(holdUntil, now + Double(retry))
            var fields = HTTPFields()
            fields.append(HTTPField(name: .retryAfter, value: String(retry)))
            return (2, 429, fields)
        }
        let windows = arrivals.keys.sorted()
        print("simulation (Retry-After only): arrivals by window \(windows.map { "\($0):\(arrivals[$0]!)/\(refusals[$0, default: 0])" }), late in hold \(lateInHold), refused here \(refusedHere)")
        let refused = refusals.keys.sorted()
        try #require(refused.count >= 2, "the provider refused in \(refused.count) windows: the learning was not exercised")
        // The first window refused in taught a guess too high; the second taught the budget.
        let learned = refused[1]
        let after = windows.filter { $0 > learned && $0 < windows.last! }
        for window in after {
            #expect(arrivals[window, default: 0] <= quota + 1, "window \(window) got \(arrivals[window, default: 0])")
        }
        // After it, a refusal only for a probe (one more after four full windows).
        let probes = after.reduce(0) { $0 + refusals[$1, default: 0] }
        #expect(probes <= after.count / 5 + 1, "refused \(probes) in \(after.count) windows after learning")
        let served = after.reduce(0) { $0 + arrivals[$1, default: 0] - refusals[$1, default: 0] }
        #expect(Double(served) >= 0.9 * Double(quota * after.count), "served \(served) of \(quota * after.count)")
        #expect(lateInHold == 0, "\(lateInHold) reached the provider 100 ms or more into a hold")
    }
}

/// A provider that sends only `Retry-After`, over two minutes: every probe past its real budget
/// costs a refusal (and the hold it starts), so a guess that probes have confirmed is probed ever
/// less often, while a budget the provider raises is still found.
@Suite("Provider limits: probing a silent provider's budget backs off")
struct ProviderLimiterProbeBackoffTests {
    @Test("probes refused at a steady budget come ever more rarely (4, 8, 16, then every 32 full windows), and a budget raised midway is found and used")
    func probesBackOff() async throws {
        let simulation = ProviderSimulation()
        var arrivals: [Int: Int] = [:], refusals: [Int: Int] = [:]
        let raisedAt = 60
        _ = await simulation.run(seconds: 120) {
            let now = simulation.seconds
            let window = Int(now.rounded(.down))
            let quota = window < raisedAt ? 20 : 25
            arrivals[window, default: 0] += 1
            guard arrivals[window, default: 0] > quota else { return (3, 200, HTTPFields()) }
            refusals[window, default: 0] += 1
            var fields = HTTPFields()
            fields.append(HTTPField(name: .retryAfter, value: String(max(1, Int((Double(window + 1) - now).rounded(.up))))))
            return (2, 429, fields)
        }
        let refused = refusals.keys.sorted()
        print("probe backoff: refused in windows \(refused.map { "\($0):\(refusals[$0]!)" })")
        try #require(refused.count >= 2, "the learning was not exercised")
        // Learned by the second refused window; before the raise, probes at most every 4, 8, 16 windows
        // after it: 3 or 4 more refused windows, where probing every fifth window refused 11.
        let steady = refused.filter { $0 > refused[1] && $0 < raisedAt }
        #expect(steady.count <= 5, "refused in \(steady) before the raise")
        // The raised budget is found: the last windows each send close to 25.
        for window in 100..<119 {
            #expect(arrivals[window, default: 0] >= 24, "window \(window) sent \(arrivals[window, default: 0]) of 25")
        }
    }
}
