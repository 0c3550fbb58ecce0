import Foundation
import HTTPTypes
import Logging
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// Endpoints whose answers take a scripted time on a manual clock: each call moves the clock on
/// by its endpoint's latency (the calls here run one at a time).
final class TimedEndpoints: Sendable {
    let clock: ManualClock
    private let state = Mutex<(latency: [String: Duration], calls: [String: Int])>(([:], [:]))

    init(clock: ManualClock) { self.clock = clock }

    func latency(_ address: String, _ latency: Duration) { state.withLock { $0.latency[address] = latency } }
    func calls(_ address: String) -> Int { state.withLock { $0.calls[address] ?? 0 } }
    func resetCalls() { state.withLock { $0.calls = [:] } }

    func client(_ config: UpstreamConfig) -> any UpstreamClient {
        Client(config: config, address: UpstreamTarget(baseURL: config.url).authority, owner: self)
    }

    struct Client: UpstreamClient {
        let config: UpstreamConfig
        let address: String
        let owner: TimedEndpoints

        func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
            let latency = owner.state.withLock { state in
                state.calls[address, default: 0] += 1
                return state.latency[address] ?? .milliseconds(2)
            }
            owner.clock.advance(by: latency)
            return GatewayResponse(status: .ok, headerFields: [:], body: Body(string: address))
        }

        func shutdown() async {}
        func retire() async {}
    }
}

/// Issue #44 on `BalancedUpstream` with a manual clock: `ewma` learns from each attempt's latency,
/// the adaptive limit from its windows, and a reload keeps both.
@Suite("Resilience: latency-aware upstream")
struct LatencyAwareUpstreamTests {
    static let addresses = ["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]

    static func make(_ endpoints: TimedEndpoints, previous: BalancedUpstream? = nil,
                     configure: (inout UpstreamConfig) -> Void = { _ in }) -> BalancedUpstream {
        var config = UpstreamConfig(name: "orders", endpoints: addresses.map { URL(string: "http://\($0)")! })
        config.balance = .ewma
        configure(&config)
        return BalancedUpstream(config: config, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
                                loops: .shared, clock: endpoints.clock, metricsFactory: RecordingMetrics(), previous: previous,
                                makeClient: endpoints.client)
    }

    static func send(_ upstream: BalancedUpstream, _ clock: ManualClock, count: Int) async throws {
        for _ in 0..<count {
            _ = try await upstream.send(Fixture.request(), context: BalancedUpstreamTests.context(clock))
        }
    }

    @Test("ewma: the endpoint 30 ms slower than the others gets only probes; after a reload the estimates are kept")
    func slowEndpointAndReload() async throws {
        let clock = ManualClock()
        let endpoints = TimedEndpoints(clock: clock)
        endpoints.latency(Self.addresses[1], .milliseconds(32))
        let upstream = Self.make(endpoints)
        try await Self.send(upstream, clock, count: 300)
        // One try while unsampled, then a probe each time its estimate has decayed below the others'.
        let slow = endpoints.calls(Self.addresses[1])
        #expect(slow >= 1 && slow < 15, "\(Self.addresses.map(endpoints.calls))")
        // A reload that keeps the endpoints keeps each loop's estimates: the slow one is not tried anew.
        let successor = Self.make(endpoints, previous: upstream)
        endpoints.resetCalls()
        try await Self.send(successor, clock, count: 20)
        #expect(endpoints.calls(Self.addresses[1]) == 0, "\(Self.addresses.map(endpoints.calls))")
        // A successor with another policy starts its own (round_robin: a third each).
        let other = Self.make(endpoints, previous: successor) { $0.balance = .roundRobin }
        endpoints.resetCalls()
        try await Self.send(other, clock, count: 30)
        #expect(endpoints.calls(Self.addresses[1]) == 10)
    }

    @Test("concurrency: adaptive on the upstream: its windows see each attempt's latency; a reload with the same settings keeps the limit")
    func adaptiveLimitAndReload() async throws {
        let clock = ManualClock()
        let endpoints = TimedEndpoints(clock: clock)
        let upstream = Self.make(endpoints) {
            var adaptive = AdaptiveConcurrencyConfig()
            adaptive.min = 1
            adaptive.sampleWindow = .milliseconds(10)
            $0.adaptiveConcurrency = adaptive
        }
        let adaptive = try #require(upstream.adaptive)
        #expect(adaptive.limit == 1)
        // One at a time at 2 ms each: a full window's worth of use, each window grows the limit
        // (1 → 2 → 3.4 …) while it stays used; the sequential caller uses only one, so it stops
        // growing once the limit is past twice that.
        try await Self.send(upstream, clock, count: 100)
        #expect(adaptive.minLatency == .milliseconds(2))
        #expect((2...3).contains(adaptive.limit), "\(adaptive.limit)")
        let report = upstream.report().adaptiveConcurrency
        #expect(report?.limit == adaptive.limit && report?.minLatencyMs == 2 && report?.inFlight == 0)
        // The same settings: the very limiter goes on. Others: a new one, from min.
        let kept = Self.make(endpoints, previous: upstream) { $0.adaptiveConcurrency = upstream.config.adaptiveConcurrency }
        #expect(kept.adaptive === adaptive)
        let changed = Self.make(endpoints, previous: upstream) {
            var other = upstream.config.adaptiveConcurrency!
            other.max = 50
            $0.adaptiveConcurrency = other
        }
        #expect(changed.adaptive !== adaptive)
        #expect(changed.adaptive?.limit == 1)
    }
}
