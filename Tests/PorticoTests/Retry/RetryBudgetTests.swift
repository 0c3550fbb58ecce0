import Foundation
import LockAudit
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// The retry budget counts requests per thread shard (issue #42): exactly, on every thread, on
/// the injected clock, and without a lock.
@Suite("Retry budget: per-shard counting")
struct RetryBudgetTests {
    @Test("many threads recording at once count exactly, including threads without a shard of their own")
    func concurrentCountsAreExact() {
        let budget = RetryBudget(ratio: 0.5, minPerSecond: 0)
        let t0 = ContinuousClock.now
        // More threads than shards: some share a shard's cells with others.
        let threads = ThreadShard.count + 8, perThread = 5_000
        let shared = Atomic<Int>(0)
        ShardedMetricsTests.onThreads(threads, warmUp: { _ in
            if !ThreadShard.current.exclusive { shared.wrappingAdd(1, ordering: .relaxed) }
        }) { thread in
            // Each thread spreads its requests over three slots of the window.
            for index in 0..<perThread {
                budget.recordRequest(at: t0.advanced(by: .seconds((thread + index) % 3)))
            }
        }
        #expect(shared.load(ordering: .relaxed) >= 8)
        #expect(budget.counts(at: t0.advanced(by: .seconds(2))) == (threads * perThread, 0))
        // Retries are allowed on what every shard counted: half of them, exactly.
        var granted = 0
        while budget.tryAcquireRetry(at: t0.advanced(by: .seconds(2))) { granted += 1 }
        #expect(granted == threads * perThread / 2)
    }

    @Test("the window slides on the injected clock: each shard's old slots fall out, none too early")
    func windowSlidesOnManualClock() {
        let clock = ManualClock()
        let budget = RetryBudget(ratio: 1, minPerSecond: 0, window: .seconds(10), slots: 10)
        // Four threads record at the clock's current instant.
        func record(_ count: Int) {
            let now = clock.now
            ShardedMetricsTests.onThreads(4) { _ in
                for _ in 0..<count { budget.recordRequest(at: now) }
            }
        }
        record(10)                                  // t = 0 s: 40
        clock.advance(by: .seconds(1))
        record(5)                                   // t = 1 s: 20
        clock.advance(by: .seconds(1))
        #expect(budget.counts(at: clock.now) == (60, 0))
        #expect(budget.tryAcquireRetry(at: clock.now))
        clock.advance(by: .milliseconds(7_999))     // t = 9.999 s: still inside the window
        #expect(budget.counts(at: clock.now) == (60, 1))
        clock.advance(by: .milliseconds(1))         // t = 10 s: the first second's requests are out
        #expect(budget.counts(at: clock.now) == (20, 1))
        clock.advance(by: .seconds(1))              // t = 11 s: so are the second's
        #expect(budget.counts(at: clock.now) == (0, 1))
        clock.advance(by: .seconds(1))              // t = 12 s: and the retry taken at 2 s
        #expect(budget.counts(at: clock.now) == (0, 0))
        // The first second's slot, used again two windows later, starts from zero on every shard.
        clock.advance(by: .seconds(8))              // t = 20 s
        record(3)
        #expect(budget.counts(at: clock.now) == (12, 0))
        clock.advance(by: .seconds(100))
        #expect(budget.counts(at: clock.now) == (0, 0))
    }

    @Test("recordRequest takes no lock on any thread; a retry takes the budget's lock (which the audit sees)")
    func recordingTakesNoLock() {
        LockAudit.whileRecording {
            // Made while recording, so its lock is audited.
            let budget = RetryBudget(ratio: 0.1, minPerSecond: 0)
            let t0 = ContinuousClock.now
            let recorders = Mutex<Set<UInt>>([])
            ShardedMetricsTests.onThreads(4, warmUp: { _ in
                recorders.withLock { _ = $0.insert(LockAudit.currentThread) }
            }) { _ in
                for index in 0..<20_000 { budget.recordRequest(at: t0.advanced(by: .milliseconds(index))) }
            }
            // On this thread, alive all along: no recording thread had its id.
            #expect(budget.tryAcquireRetry(at: t0.advanced(by: .seconds(5))))
            let threads = recorders.withLock { $0 }
            let budgetLocks = LockAudit.report().filter { $0.site.file.hasSuffix("/RetryBudget.swift") }
            for lock in budgetLocks {
                let byRecorders = lock.threads.filter { threads.contains($0.key) }
                #expect(byRecorders.isEmpty, "\(lock.site): taken by recording threads \(byRecorders)")
            }
            // The audit saw this budget's lock when the retry took it: the check above can fail.
            let retrier = LockAudit.currentThread
            #expect(budgetLocks.contains { ($0.threads[retrier] ?? 0) >= 1 })
        }
    }
}
