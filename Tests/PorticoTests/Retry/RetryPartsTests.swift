import Foundation
import Portico
import Testing

@Suite("Retry: backoff, Retry-After, budget")
struct RetryPartsTests {
    @Test("backoff ceilings double from base and stop at cap")
    func backoffCeilings() {
        let backoff = Backoff(base: .milliseconds(25), cap: .seconds(1))
        #expect(backoff.ceiling(forRetry: 1) == .milliseconds(25))
        #expect(backoff.ceiling(forRetry: 2) == .milliseconds(50))
        #expect(backoff.ceiling(forRetry: 3) == .milliseconds(100))
        #expect(backoff.ceiling(forRetry: 6) == .milliseconds(800))
        #expect(backoff.ceiling(forRetry: 7) == .seconds(1))
        #expect(backoff.ceiling(forRetry: 1000) == .seconds(1))
        #expect(Backoff(base: .zero, cap: .seconds(1)).ceiling(forRetry: 5) == .zero)
    }

    @Test("full jitter stays within [0, ceiling]")
    func jitterBounds() {
        let backoff = Backoff(base: .milliseconds(25), cap: .seconds(1))
        #expect(backoff.delay(forRetry: 3, unit: 0) == .zero)
        #expect(backoff.delay(forRetry: 3, unit: 0.5) == .milliseconds(50))
        for retry in 1...12 {
            for _ in 0..<200 {
                let delay = backoff.delay(forRetry: retry, unit: Double.random(in: 0..<1))
                #expect(delay >= .zero && delay <= backoff.ceiling(forRetry: retry))
            }
        }
        #expect(backoff.delay(forRetry: 1, unit: 7) == .milliseconds(25))   // a bad source is clamped
    }

    static let now = Date(timeIntervalSince1970: 784_111_777)   // Sun, 06 Nov 1994 08:49:37 GMT

    @Test("Retry-After delta-seconds")
    func retryAfterSeconds() {
        #expect(RetryAfter.delay("0", now: Self.now) == .zero)
        #expect(RetryAfter.delay("3", now: Self.now) == .seconds(3))
        #expect(RetryAfter.delay(" 120 ", now: Self.now) == .seconds(120))
        #expect(RetryAfter.delay("99999999999999999999999", now: Self.now) == .seconds(1_000_000_000))
    }

    @Test("Retry-After HTTP-dates in all three formats")
    func retryAfterDates() {
        #expect(RetryAfter.delay("Sun, 06 Nov 1994 08:49:47 GMT", now: Self.now) == .seconds(10))
        #expect(RetryAfter.delay("Sunday, 06-Nov-94 08:49:47 GMT", now: Self.now) == .seconds(10))
        #expect(RetryAfter.delay("Sun Nov  6 08:49:47 1994", now: Self.now) == .seconds(10))
        #expect(RetryAfter.delay("Sun, 06 Nov 1994 08:48:37 GMT", now: Self.now) == .zero)   // past: now
        #expect(HTTPDate.parse("Thu, 01 Jan 1970 00:00:00 GMT") == Date(timeIntervalSince1970: 0))
        // One space between parts, except asctime's padding before a one-digit day.
        for malformed in ["Thu,  01 Jan 1970 00:00:00 GMT", "Thu, 01 Jan 1970  00:00:00 GMT", "Thu, 01 Jan 1970 00:00:00 GMT ",
                          " Thu, 01 Jan 1970 00:00:00 GMT", "Thursday,  01-Jan-70 00:00:00 GMT", "Thu Jan 1 00:00:00 1970",
                          "Thu Jan   1 00:00:00 1970", "Thu  Jan  1 00:00:00 1970"] {
            #expect(HTTPDate.parse(malformed) == nil, "\(malformed)")
        }
        #expect(HTTPDate.parse("Thu Jan  1 00:00:00 1970") == Date(timeIntervalSince1970: 0))
        #expect(HTTPDate.parse("Sat Jan 10 00:00:00 1970") == Date(timeIntervalSince1970: 9 * 86_400))
        #expect(HTTPDate.parse("Tue, 29 Feb 2028 23:59:59 GMT") == Date(timeIntervalSince1970: 1_835_481_599))
    }

    @Test("garbage Retry-After values are ignored", arguments: [
        "", "soon", "-1", "1.5", "+3", "3s", "Sun, 06 Nov 1994 08:49:47 UTC", "Sun, 06 Nov 1994 25:00:00 GMT",
        "Sun, 6 Nov 1994 08:49:47 GMT", "06 Nov 1994 08:49:47 GMT", "Sun, 06 Foo 1994 08:49:47 GMT",
    ])
    func retryAfterGarbage(value: String) {
        #expect(RetryAfter.delay(value, now: Self.now) == nil)
    }

    @Test("the budget allows the ratio of requests in the window")
    func budgetRatio() {
        let budget = RetryBudget(ratio: 0.2, minPerSecond: 0)
        let t0 = ContinuousClock.now
        for _ in 0..<10 { budget.recordRequest(at: t0) }
        #expect(budget.tryAcquireRetry(at: t0))
        #expect(budget.tryAcquireRetry(at: t0))
        #expect(!budget.tryAcquireRetry(at: t0))   // 2 = 20% of 10
        #expect(budget.counts(at: t0) == (10, 2))
        for _ in 0..<5 { budget.recordRequest(at: t0) }
        #expect(budget.tryAcquireRetry(at: t0))    // 3 = 20% of 15
        #expect(!budget.tryAcquireRetry(at: t0))
    }

    @Test("the budget has a floor of min_retries_per_second over the window")
    func budgetFloor() {
        let budget = RetryBudget(ratio: 0.2, minPerSecond: 3, window: .seconds(10))
        let t0 = ContinuousClock.now
        #expect(budget.allowance(requests: 0) == 30)
        #expect(budget.allowance(requests: 1000) == 200)
        var granted = 0
        while budget.tryAcquireRetry(at: t0) { granted += 1 }
        #expect(granted == 30)
    }

    @Test("the window slides: old requests and retries fall out")
    func budgetSlides() {
        let budget = RetryBudget(ratio: 0.5, minPerSecond: 0, window: .seconds(10), slots: 10)
        let t0 = ContinuousClock.now
        for _ in 0..<4 { budget.recordRequest(at: t0) }
        #expect(budget.tryAcquireRetry(at: t0))
        #expect(budget.tryAcquireRetry(at: t0))
        #expect(!budget.tryAcquireRetry(at: t0))
        // Half a window later everything still counts.
        #expect(budget.counts(at: t0.advanced(by: .seconds(5))) == (4, 2))
        budget.recordRequest(at: t0.advanced(by: .seconds(5)))
        budget.recordRequest(at: t0.advanced(by: .seconds(5)))
        #expect(budget.tryAcquireRetry(at: t0.advanced(by: .seconds(5))))   // 3 ≤ 0.5 × 6
        // A window later only the requests from t0+5s remain.
        let later = t0.advanced(by: .milliseconds(10_500))
        #expect(budget.counts(at: later) == (2, 1))
        #expect(!budget.tryAcquireRetry(at: later))
        // Long idle: all gone.
        #expect(budget.counts(at: t0.advanced(by: .seconds(100))) == (0, 0))
    }

    @Test("the budget is safe under concurrent use")
    func budgetConcurrent() async {
        let budget = RetryBudget(ratio: 0.1, minPerSecond: 0)
        let t0 = ContinuousClock.now
        let granted = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var granted = 0
                    for _ in 0..<1000 {
                        budget.recordRequest(at: t0)
                        if budget.tryAcquireRetry(at: t0) { granted += 1 }
                    }
                    return granted
                }
            }
            return await group.reduce(0, +)
        }
        #expect(granted <= 800)
        #expect(granted >= 790)
        #expect(budget.counts(at: t0) == (8000, granted))
    }
}
