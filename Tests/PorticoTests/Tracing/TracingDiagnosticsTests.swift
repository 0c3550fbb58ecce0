import Logging
import Metrics
import MetricsTestKit
@testable import Portico
import PorticoTesting
import Testing

@Suite("Tracing: swift-otel's diagnostics")
struct TracingDiagnosticsTests {
    @Test("the batch processor's drop report adds to portico_trace_spans_dropped_total; every message reaches Portico's log")
    func dropsCounted() throws {
        let metrics = TestMetrics()
        let drops = DropCount(counter: Counter(label: "portico_trace_spans_dropped_total", dimensions: [], factory: metrics))
        let forwarded = LogCapture(message: "Spans were dropped this iteration because queue was full")
        let logger = Logger(label: "swift-otel") { _ in TracingDiagnostics(forwardingTo: forwarded.logger, drops: drops) }
        logger.warning("Spans were dropped this iteration because queue was full",
                       metadata: ["queue_size": "4", "dropped_count": "56"])
        logger.warning("Spans were dropped this iteration because queue was full", metadata: ["dropped_count": "3"])
        logger.warning("Failed to export batch.", metadata: ["batch_size": "4"])
        #expect(drops.value == 59)
        #expect(try metrics.expectCounter("portico_trace_spans_dropped_total").totalValue == 59)
        #expect(forwarded.records.count == 2)
        #expect(forwarded.records.first?["queue_size"] == "4")
    }
}
