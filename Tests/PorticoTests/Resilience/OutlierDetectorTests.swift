import Foundation
import Logging
@testable import Portico
import PorticoTesting
import Testing

/// A detector over a few endpoints, on a manual clock: failures and successes are fed to it
/// directly, as `BalancedUpstream` does after each exchange.
struct OutlierBench {
    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    let clock = ManualClock()
    let metrics = RecordingMetrics()
    let endpoints: [EndpointState]
    let detector: OutlierDetector

    init(count: Int = 3, configure: (inout OutlierDetectionConfig) -> Void = { _ in }) {
        var config = OutlierDetectionConfig()
        config.consecutiveFailures = 3
        config.baseEjection = .seconds(30)
        config.maxEjection = 1
        configure(&config)
        let scripted = ScriptedEndpoints()
        let metrics = metrics
        endpoints = (0..<count).map { index in
            let url = URL(string: "http://10.0.0.\(index + 1):80")!
            let own = UpstreamConfig(name: "orders", url: url)
            return EndpointState(url: url, config: own, client: scripted.client(own),
                                 metrics: EndpointMetrics(upstream: "orders", endpoint: "10.0.0.\(index + 1):80", factory: metrics))
        }
        detector = OutlierDetector(config: config, upstream: "orders", origin: clock.now, logger: Self.logger)
    }

    func status(_ index: Int) -> EndpointStatus { detector.status(of: endpoints[index], at: clock.now) }

    func fail(_ index: Int, _ kind: EndpointFailure = .gatewayStatus, times: Int = 1) {
        for _ in 0..<times {
            detector.failed(endpoints[index], kind, at: detector.moment(clock.now), among: endpoints)
        }
    }

    func succeed(_ index: Int, allDown: Bool = false) {
        detector.succeeded(endpoints[index], at: detector.moment(clock.now), allDown: allDown)
    }

    /// The endpoint's health checks say `passed`, `times` in a row.
    func check(_ index: Int, passed: Bool, times: Int = 1) {
        let check = EndpointHealthCheck(endpoint: endpoints[index], config: HealthCheckConfig(path: "/healthz"), upstream: "orders",
                                        clock: clock, logger: Self.logger)
        for _ in 0..<times { check.record(passed) }
    }

    func ejectedGauge(_ index: Int) -> Int64 {
        metrics.value("portico_upstream_endpoint_ejected", [("upstream", "orders"), ("endpoint", "10.0.0.\(index + 1):80")])
    }

    func ejected(for duration: Duration, _ reason: EndpointFailure) -> EndpointStatus {
        .ejected(until: clock.now.advanced(by: duration), reason: reason)
    }
}

/// `EndpointStatus` as the outlier detector moves it, step by step on an injected clock.
@Suite("Resilience: OutlierDetector and EndpointStatus")
struct OutlierDetectorTests {
    @Test("what each status means for picking, and its word")
    func meanings() {
        let until = ContinuousClock.now
        let cases: [(EndpointStatus, takesTraffic: Bool, isUp: Bool, name: String)] = [
            (.up, true, true, "up"), (.probation, true, true, "probation"), (.failing, true, false, "failing"),
            (.ejected(until: until, reason: .reset), false, false, "ejected"), (.unhealthy, false, false, "unhealthy"),
        ]
        for (status, takesTraffic, isUp, name) in cases {
            #expect(status.takesTraffic == takesTraffic, "\(status)")
            #expect(status.isUp == isUp, "\(status)")
            #expect(status.name == name)
        }
        #expect(EndpointStatus.ejected(until: until, reason: .reset).description == "ejected (reset)")
    }

    @Test("up until consecutive_failures in a row; then ejected for base_ejection, with the failure that did it")
    func upToEjected() {
        let bench = OutlierBench()
        bench.fail(0, times: 2)
        #expect(bench.status(0) == .up)
        // A success between breaks the run.
        bench.succeed(0)
        bench.fail(0, times: 2)
        #expect(bench.status(0) == .up)
        #expect(bench.ejectedGauge(0) == 0)
        bench.fail(0, .timeout)
        #expect(bench.status(0) == bench.ejected(for: .seconds(30), .timeout))
        #expect(bench.endpoints[0].outlier.ejections == 1)
        #expect(bench.endpoints[0].outlier.failuresInARow == 0)
        #expect(bench.ejectedGauge(0) == 1)
        // A failure of an exchange begun before the ejection changes nothing but the last failure.
        bench.clock.advance(by: .seconds(10))
        bench.fail(0, .reset)
        #expect(bench.status(0) == .ejected(until: bench.clock.now.advanced(by: .seconds(20)), reason: .timeout))
        #expect(bench.detector.lastFailure(of: bench.endpoints[0])?.kind == .reset)
        #expect(bench.detector.lastFailure(of: bench.endpoints[0])?.at == bench.clock.now)
        #expect(bench.endpoints[0].outlier.ejections == 1)
        #expect([1, 2].allSatisfy { bench.status($0) == .up })
    }

    @Test("after an ejection: probation; one failure ejects again for longer, one success makes it up")
    func probation() {
        let bench = OutlierBench()
        bench.fail(1, times: 3)
        bench.clock.advance(by: .seconds(29))
        #expect(bench.status(1) == bench.ejected(for: .seconds(1), .gatewayStatus))
        bench.clock.advance(by: .seconds(1))
        #expect(bench.status(1) == .probation)
        // Probation is the gauge's "ejected until its first success" too: no event began it.
        #expect(bench.ejectedGauge(1) == 1)
        bench.fail(1, .reset)
        #expect(bench.status(1) == bench.ejected(for: .seconds(60), .reset))
        bench.clock.advance(by: .seconds(60))
        #expect(bench.status(1) == .probation)
        bench.succeed(1)
        #expect(bench.status(1) == .up)
        #expect(bench.ejectedGauge(1) == 0)
        // A fresh run: three failures again, and 30 s again.
        bench.fail(1, times: 2)
        #expect(bench.status(1) == .up)
        bench.fail(1)
        #expect(bench.status(1) == bench.ejected(for: .seconds(30), .gatewayStatus))
    }

    @Test("ejections in a row multiply base_ejection up to 10 times")
    func multiplierCap() {
        let bench = OutlierBench()
        bench.fail(0, times: 3)
        for times in 2...12 {
            bench.clock.advance(by: .seconds(30 * min(times - 1, 10)))
            #expect(bench.status(0) == .probation, "\(times)")
            bench.fail(0)
            #expect(bench.status(0) == bench.ejected(for: .seconds(30 * min(times, 10)), .gatewayStatus), "\(times)")
        }
    }

    @Test("failing: an endpoint the cap keeps in rotation takes traffic but is not up; a success makes it up")
    func failing() {
        // Two endpoints at 50 %: one may be ejected at a time.
        let bench = OutlierBench(count: 2) { $0.maxEjection = 0.5 }
        bench.fail(0, times: 3)
        #expect(bench.status(0) == bench.ejected(for: .seconds(30), .gatewayStatus))
        bench.fail(1, times: 3)
        #expect(bench.status(1) == .failing)
        #expect(bench.endpoints[1].outlier.ejections == 0)
        #expect(bench.ejectedGauge(1) == 0)
        bench.fail(1, times: 5)
        #expect(bench.status(1) == .failing)
        bench.succeed(1)
        #expect(bench.status(1) == .up)

        // One endpoint alone is never ejected, however it rounds.
        let alone = OutlierBench(count: 1)
        alone.fail(0, times: 10)
        #expect(alone.status(0) == .failing)
    }

    @Test("the cap counts only endpoints that are up: none left up, no ejection")
    func capNeedsAnotherUp() {
        let bench = OutlierBench(count: 2)
        bench.check(1, passed: false, times: 3)
        #expect(bench.status(1) == .unhealthy)
        bench.fail(0, times: 3)
        #expect(bench.status(0) == .failing)
    }

    @Test("unhealthy: the health verdict, outranked only by an ejection; healthy again, the record shows through")
    func unhealthy() {
        let bench = OutlierBench()
        bench.check(2, passed: false, times: 2)
        #expect(bench.status(2) == .up)
        bench.check(2, passed: false)
        #expect(bench.status(2) == .unhealthy)
        // Ejected while unhealthy (an exchange in flight failing): the ejection says more.
        bench.fail(2, times: 3)
        #expect(bench.status(2) == bench.ejected(for: .seconds(30), .gatewayStatus))
        bench.clock.advance(by: .seconds(30))
        #expect(bench.status(2) == .unhealthy)
        bench.check(2, passed: true, times: 2)
        #expect(bench.status(2) == .probation)
    }

    @Test("all down: an ejected endpoint picked among all that answers well is up at once; otherwise it stays out")
    func allDownLiftsEjection() {
        let bench = OutlierBench()
        bench.fail(0, times: 3)
        bench.succeed(0, allDown: false)
        #expect(bench.status(0) == bench.ejected(for: .seconds(30), .gatewayStatus))
        bench.succeed(0, allDown: true)
        #expect(bench.status(0) == .up)
        #expect(bench.ejectedGauge(0) == 0)
    }

    @Test("a successor's detector over the same records and origin reads the same statuses")
    func takenOver() {
        let bench = OutlierBench()
        bench.fail(0, times: 3)
        bench.clock.advance(by: .seconds(5))
        var config = OutlierDetectionConfig()
        config.consecutiveFailures = 3
        let successor = OutlierDetector(config: config, upstream: "orders", origin: bench.detector.origin, logger: OutlierBench.logger)
        #expect(successor.status(of: bench.endpoints[0], at: bench.clock.now) == bench.status(0))
        #expect(successor.status(of: bench.endpoints[1], at: bench.clock.now) == .up)
    }
}
