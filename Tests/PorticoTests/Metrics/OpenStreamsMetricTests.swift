import MetricsTestKit
@testable import Portico
import PorticoTesting
import Testing

/// `portico_open_streams`: what the Grafana dashboard's "open streams" panel draws.
@Suite("Gateway metrics: open streams", .timeLimit(.minutes(1)))
struct OpenStreamsMetricTests {
    typealias S = MiddlewareStreamFixture

    @Test("a streamed response counts as open from its head until its body ends, fails or is dropped")
    func openUntilTheEnd() async throws {
        let factory = TestMetrics()
        let metrics = GatewayMetrics(factory: factory)
        let clock = ManualClock()
        let open = try factory.expectMeter("portico_open_streams")
        #expect(open.lastValue == nil, "nothing recorded before a stream")

        metrics.requestStarted()
        var (completed, completedWriter) = S.body()
        completed.append(metrics.streamObserver(route: "a", method: "GET", code: 200, start: clock.now, clock: clock), keepsLength: true)
        metrics.requestStarted()
        var (failed, failedWriter) = S.body()
        failed.append(metrics.streamObserver(route: "b", method: "GET", code: 200, start: clock.now, clock: clock), keepsLength: true)
        metrics.requestStarted()
        do {
            var (dropped, _) = S.body()
            dropped.append(metrics.streamObserver(route: "c", method: "GET", code: 200, start: clock.now, clock: clock), keepsLength: true)
            #expect(open.lastValue == 3)
        }
        #expect(open.lastValue == 2, "a body dropped unread is no longer open")

        let completedReader = completed.reader()
        try await completedWriter.write(S.buffer("abc"))
        _ = try await completedReader.next()
        #expect(open.lastValue == 2, "a body still flowing stays open")
        completedWriter.finish()
        _ = try await S.rest(of: completedReader)
        #expect(open.lastValue == 1)

        let failedReader = failed.reader()
        failedWriter.fail(GatewayError(.upstreamConnectionClosed, message: "reset"))
        await #expect(throws: GatewayError.self) { try await failedReader.next() }
        failedReader.close(nil)
        #expect(open.lastValue == 0)
        #expect(try factory.expectMeter("portico_in_flight_requests").lastValue == 0)
    }
}
