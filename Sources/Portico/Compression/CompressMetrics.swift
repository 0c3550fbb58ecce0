import CoreMetrics
import Metrics
import Synchronization

/// `compress` counters. The compression ratio is derived rather than recorded:
/// `rate(portico_compress_output_bytes_total) / rate(portico_compress_input_bytes_total)` per
/// route is the fraction of bytes still sent, over any window Prometheus is asked for — a
/// per-response histogram would weigh a 2 KiB and a 2 MiB body the same.
/// Handles are cached per label set; `route` comes from configuration, `result` from `Outcome`.
final class CompressMetrics: Sendable {
    /// What happened to one response; the `result` label.
    enum Outcome: String, Sendable, CaseIterable {
        case compressed
        /// The client does not accept gzip (or prefers identity).
        case notAccepted = "not_accepted"
        /// The content type is not on the list, or there is none.
        case type
        /// Below `min_bytes`.
        case tooSmall = "too_small"
        /// Already has a content coding.
        case encoded
        /// `Cache-Control: no-transform` on the request or the response.
        case noTransform = "no_transform"
        /// A status without content to compress (1xx, 204, 304) or a range (206, `Content-Range`).
        case status
        /// HEAD: headers as for GET, no body to compress.
        case head
        /// gzip would not have been smaller.
        case incompressible
        /// zlib failed; identity was sent.
        case error
    }

    private struct RouteHandles {
        var input: Counter
        var output: Counter
        var results: [Outcome: Counter]
    }

    private let factory: any MetricsFactory
    private let handles = Mutex<[String: RouteHandles]>([:])

    init(factory: any MetricsFactory) {
        self.factory = factory
    }

    func record(route: String?, _ outcome: Outcome, bytesIn: Int = 0, bytesOut: Int = 0) {
        let routeHandles = handle(route: route ?? "")
        routeHandles.results[outcome]?.increment()
        if outcome == .compressed {
            countBytes(routeHandles, bytesIn: bytesIn, bytesOut: bytesOut)
        }
    }

    /// The bytes of a compressed stream, counted when it ends (its `compressed` result was
    /// counted when its head went out).
    func countBytes(route: String?, bytesIn: Int, bytesOut: Int) {
        countBytes(handle(route: route ?? ""), bytesIn: bytesIn, bytesOut: bytesOut)
    }

    private func countBytes(_ handle: RouteHandles, bytesIn: Int, bytesOut: Int) {
        handle.input.increment(by: Int64(bytesIn))
        handle.output.increment(by: Int64(bytesOut))
    }

    private func handle(route: String) -> RouteHandles {
        handles.withLock { handles in
            if let existing = handles[route] { return existing }
            let dimensions = [("route", route)]
            var results: [Outcome: Counter] = [:]
            for outcome in Outcome.allCases {
                results[outcome] = Counter(label: "portico_compress_responses_total",
                                           dimensions: dimensions + [("result", outcome.rawValue)], factory: factory)
            }
            let created = RouteHandles(
                input: Counter(label: "portico_compress_input_bytes_total", dimensions: dimensions, factory: factory),
                output: Counter(label: "portico_compress_output_bytes_total", dimensions: dimensions, factory: factory),
                results: results)
            handles[route] = created
            return created
        }
    }
}
