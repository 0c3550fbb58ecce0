import MetricsTestKit
import NIOCore
@testable import Portico
import PorticoTesting
import Testing

/// Time to first byte, and a streamed request's duration recorded when its body ends.
@Suite("Gateway metrics: streamed responses", .timeLimit(.minutes(1)))
struct GatewayMetricsStreamingTests {
    typealias S = MiddlewareStreamFixture

    static func nanoseconds(_ milliseconds: Int64) -> Int64 { milliseconds * 1_000_000 }

    @Test("the stream observer records time to first byte as it leaves, and the request when the body ends")
    func recordedAtTheEnd() async throws {
        let factory = TestMetrics()
        let metrics = GatewayMetrics(factory: factory)
        let clock = ManualClock()
        let start = clock.now
        metrics.requestStarted()
        var (body, writer) = S.body()
        body.append(metrics.streamObserver(route: "api", method: "GET", code: 200, start: start, clock: clock),
                    keepsLength: true)
        clock.advance(by: .milliseconds(15))
        let reader = body.reader()
        try await writer.write(S.buffer("abc"))
        _ = try await reader.next()
        let ttfb = try factory.expectTimer("portico_time_to_first_byte_seconds", [("route", "api")])
        #expect(ttfb.values == [Self.nanoseconds(15)])
        #expect(factory.counters(label: "portico_requests_total").isEmpty)
        #expect(try factory.expectMeter("portico_in_flight_requests").lastValue == 1)

        clock.advance(by: .milliseconds(20))
        writer.finish()
        _ = try await S.rest(of: reader)
        #expect(ttfb.values == [Self.nanoseconds(15)])
        let duration = try factory.expectTimer("portico_request_duration_seconds", [("route", "api"), ("method", "GET")])
        #expect(duration.values == [Self.nanoseconds(35)])
        #expect(try factory.expectCounter("portico_requests_total", [("route", "api"), ("method", "GET"), ("code", "200")])
            .totalValue == 1)
        #expect(try factory.expectMeter("portico_in_flight_requests").lastValue == 0)
    }

    @Test("a body that never completes, or is dropped unread, still finishes the request once; no time to first byte without one")
    func unfinishedBodies() async throws {
        let factory = TestMetrics()
        let metrics = GatewayMetrics(factory: factory)
        let clock = ManualClock()
        metrics.requestStarted()
        metrics.requestStarted()
        do {
            var (body, _) = S.body()
            body.append(metrics.streamObserver(route: "api", method: "GET", code: 200, start: clock.now, clock: clock),
                        keepsLength: true)
        }
        var (body, writer) = S.body()
        body.append(metrics.streamObserver(route: "api", method: "GET", code: 200, start: clock.now, clock: clock),
                    keepsLength: true)
        let reader = body.reader()
        writer.fail(GatewayError(.upstreamConnectionClosed, message: "reset"))
        await #expect(throws: GatewayError.self) { try await reader.next() }
        reader.close(nil)
        #expect(try factory.expectCounter("portico_requests_total", [("route", "api"), ("method", "GET"), ("code", "200")])
            .totalValue == 2)
        #expect(try factory.expectMeter("portico_in_flight_requests").lastValue == 0)
        #expect(factory.timers(label: "portico_time_to_first_byte_seconds").allSatisfy { $0.values.isEmpty })
    }

    @Test("a buffered response's time to first byte is recorded by firstByte(route:after:)")
    func buffered() throws {
        let factory = TestMetrics()
        let metrics = GatewayMetrics(factory: factory)
        metrics.firstByte(route: nil, after: .milliseconds(3))
        #expect(try factory.expectTimer("portico_time_to_first_byte_seconds", [("route", "")]).values == [Self.nanoseconds(3)])
    }
}
