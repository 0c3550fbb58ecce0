@testable import Portico
import PorticoTesting
import Testing

@Suite("Hedge timing: the latency estimator")
struct LatencyEstimatorTests {
    let clock = ManualClock()

    @Test("nearest-rank percentile of recent samples; none below the minimum count")
    func percentile() {
        let estimator = LatencyEstimator(.init(percentile: 90, minimumSamples: 10))
        for ms in 1...9 { estimator.record(.milliseconds(ms), at: clock.now) }
        #expect(estimator.estimate(at: clock.now) == nil)
        clock.advance(by: .milliseconds(100))
        estimator.record(.milliseconds(10), at: clock.now)
        #expect(estimator.estimate(at: clock.now) == .milliseconds(9))
        #expect(LatencyEstimator.rank(50, of: 10) == 4 && LatencyEstimator.rank(99.9, of: 10) == 9 && LatencyEstimator.rank(50, of: 1) == 0)
    }

    @Test("the estimate is cached for refresh, then follows new samples")
    func refresh() {
        let estimator = LatencyEstimator(.init(percentile: 50, refresh: .milliseconds(100), minimumSamples: 1))
        let view = estimator.view
        view.record(.milliseconds(10), at: clock.now, shard: 0)
        #expect(view.estimate(at: clock.now, shard: 0) == .milliseconds(10))
        for _ in 0..<5 { view.record(.milliseconds(200), at: clock.now, shard: 0) }
        #expect(view.estimate(at: clock.now, shard: 0) == .milliseconds(10))  // cached
        clock.advance(by: .milliseconds(100))
        #expect(view.estimate(at: clock.now, shard: 0) == .milliseconds(200))
    }

    @Test("samples of every shard are merged; old ones expire after the window")
    func mergeAndExpire() {
        let estimator = LatencyEstimator(.init(percentile: 50, window: .seconds(30), minimumSamples: 4))
        let view = estimator.view
        view.record(.milliseconds(1), at: clock.now, shard: 0)
        view.record(.milliseconds(2), at: clock.now, shard: 1)
        clock.advance(by: .seconds(20))
        view.record(.milliseconds(30), at: clock.now, shard: 2)
        view.record(.milliseconds(40), at: clock.now, shard: 3)
        #expect(view.estimate(at: clock.now, shard: 5) == .milliseconds(2))
        clock.advance(by: .seconds(15))
        // The first two are older than the window: two samples left, below the minimum.
        #expect(view.estimate(at: clock.now, shard: 5) == nil)
        view.record(.milliseconds(50), at: clock.now, shard: 0)
        view.record(.milliseconds(60), at: clock.now, shard: 0)
        clock.advance(by: .milliseconds(100))
        #expect(view.estimate(at: clock.now, shard: 5) == .milliseconds(40))
    }

    @Test("a ring keeps only its last samples: memory is bounded, the estimate recent")
    func ringBound() {
        let estimator = LatencyEstimator(.init(percentile: 99.9, minimumSamples: 1))
        let view = estimator.view
        view.record(.seconds(5), at: clock.now, shard: 0)
        for _ in 0..<LatencyEstimator.samplesPerShard { view.record(.milliseconds(3), at: clock.now, shard: 0) }
        #expect(view.estimate(at: clock.now, shard: 0) == .milliseconds(3))
        // Latencies beyond the cell's 24 bits of microseconds saturate.
        let long = LatencyEstimator(.init(percentile: 50, minimumSamples: 1))
        long.view.record(.seconds(60), at: clock.now, shard: 0)
        #expect(long.view.estimate(at: clock.now, shard: 0) == .microseconds(LatencyEstimator.maxMicroseconds))
    }
}

@Suite("Hedge race decisions")
struct HedgeRaceTests {
    static func response(_ status: Int) -> GatewayResponse { RetryFixture.response(status) }

    @Test("the first final response wins and the rest are cancelled")
    func firstFinalWins() {
        var race = HedgeRace()
        race.hedgeSent()
        guard case .won(let number, let outcome, let cancelling, let discard) = race.ended(1, .success(Self.response(200)), final: true) else {
            Issue.record("no winner"); return
        }
        #expect(number == 1 && outcome.response?.status.code == 200 && cancelling == 1 && discard == nil)
        #expect(!race.wantsHedge)
        guard case .late(let late) = race.ended(0, .success(Self.response(200)), final: true) else { Issue.record("not late"); return }
        #expect(late != nil)
    }

    @Test("a retryable outcome waits for the others; a response is kept before an error")
    func retryableWaits() {
        var race = HedgeRace()
        race.hedgeSent()
        race.hedgeSent()
        guard case .waiting(nil) = race.ended(0, .success(Self.response(503)), final: false) else { Issue.record("did not wait"); return }
        #expect(race.wantsHedge)
        guard case .waiting(nil) = race.ended(2, .failure(UpstreamError.connectTimeout), final: false) else { Issue.record("did not wait"); return }
        guard case .won(let number, let outcome, let cancelling, let discard) = race.ended(1, .failure(UpstreamError.timeout), final: false) else {
            Issue.record("no outcome"); return
        }
        #expect(number == 0 && outcome.response?.status.code == 503 && cancelling == 0 && discard == nil)
    }

    @Test("a final response after a held one wins and the held one is discarded")
    func heldDiscarded() {
        var race = HedgeRace()
        race.hedgeSent()
        _ = race.ended(0, .success(Self.response(502)), final: false)
        guard case .won(let number, _, _, let discard) = race.ended(1, .success(Self.response(200)), final: true) else {
            Issue.record("no winner"); return
        }
        #expect(number == 1 && discard?.status.code == 502)
    }

    @Test("alone, an attempt's outcome is the race's at once")
    func alone() {
        var race = HedgeRace()
        guard case .won(0, let outcome, 0, nil) = race.ended(0, .failure(UpstreamError.connectTimeout), final: false) else {
            Issue.record("no outcome"); return
        }
        #expect(outcome.response == nil)
    }
}
