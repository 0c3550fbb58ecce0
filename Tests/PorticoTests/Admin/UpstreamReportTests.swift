import Foundation
import Logging
@testable import Portico
import PorticoTesting
import Testing

/// `GET /upstreams` says what `EndpointStatus` says, and works nothing out of the records itself.
@Suite("Admin: GET /upstreams reads each endpoint's status")
struct UpstreamReportTests {
    @Test("an endpoint's report is its status: word, ejection instant and reason; nothing from its record")
    func endpointFromStatus() {
        let bench = OutlierBench(count: 1)
        let endpoint = bench.endpoints[0]
        let wall: (ContinuousClock.Instant) -> String = { instant in
            UpstreamReport.timestamp(bench.clock.wallNow.addingTimeInterval(bench.clock.now.duration(to: instant).secondsValue))
        }
        // Its record is clean: a report that derived the state from it would say `up`.
        let until = bench.clock.now.advanced(by: .seconds(90))
        let ejected = UpstreamReport.Endpoint(endpoint, status: .ejected(until: until, reason: .timeout), failuresInARow: 0,
                                              ejections: 0, inFlight: 0, lastFailure: nil, wall: wall)
        #expect(ejected.state == "ejected")
        #expect(ejected.ejectionReason == "timeout")
        #expect(ejected.ejectedUntil == UpstreamReport.timestamp(bench.clock.wallNow.addingTimeInterval(90)))
        for status in [EndpointStatus.up, .failing, .probation, .unhealthy] {
            let report = UpstreamReport.Endpoint(endpoint, status: status, failuresInARow: 0, ejections: 0, inFlight: 0,
                                                 lastFailure: nil, wall: wall)
            #expect(report.state == status.name)
            #expect(report.ejectedUntil == nil && report.ejectionReason == nil, "\(status)")
        }
    }

    @Test("a live upstream with one endpoint in each status reports each as its detector says")
    func everyStatus() async {
        let scripted = ScriptedEndpoints()
        let clock = ManualClock()
        var config = UpstreamConfig(name: "orders", endpoints: (1...5).map { URL(string: "http://10.0.0.\($0):80")! })
        config.outlierDetection.consecutiveFailures = 3
        config.outlierDetection.baseEjection = .seconds(30)
        // 5 × 20 %: one ejection at a time.
        config.outlierDetection.maxEjection = 0.2
        let upstream = BalancedUpstream(config: config, logger: OutlierBench.logger, loops: .shared, clock: clock,
                                        metricsFactory: RecordingMetrics(), makeClient: scripted.client)
        let endpoints = upstream.endpoints
        func fail(_ index: Int, times: Int) {
            for _ in 0..<times {
                upstream.outlier.failed(endpoints[index], .gatewayStatus, at: upstream.outlier.moment(clock.now), among: endpoints)
            }
        }
        // 3: ejected, then its time is over: probation.
        fail(3, times: 3)
        clock.advance(by: .seconds(30))
        // 2: ejected now; 1: failing, the cap (one at a time) keeps it; 4: its checks failed.
        fail(2, times: 3)
        fail(1, times: 3)
        let check = EndpointHealthCheck(endpoint: endpoints[4], config: HealthCheckConfig(path: "/healthz"), upstream: "orders",
                                        clock: clock, logger: OutlierBench.logger)
        for _ in 0..<3 { check.record(false) }

        let statuses = upstream.statuses.map(\.status)
        #expect(statuses == [.up, .failing, .ejected(until: clock.now.advanced(by: .seconds(30)), reason: .gatewayStatus),
                             .probation, .unhealthy])
        let report = upstream.report()
        #expect(report.endpoints.map(\.state) == statuses.map(\.name))
        #expect(report.endpoints.map(\.state) == ["up", "failing", "ejected", "probation", "unhealthy"])
        #expect(report.endpoints[2].ejectionReason == "gateway_status")
        #expect(report.endpoints[2].ejectedUntil == UpstreamReport.timestamp(clock.wallNow.addingTimeInterval(30)))
        #expect(report.endpoints.enumerated().allSatisfy { $0.offset == 2 || $0.element.ejectedUntil == nil })
        #expect(report.endpoints[1].consecutiveFailures == 3)
        #expect(report.endpoints[3].ejections == 1)
        #expect(report.endpoints[4].health == "unhealthy")
        #expect(!report.allDown)
        await upstream.shutdown()
    }
}
