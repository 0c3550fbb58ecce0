import CoreMetrics
import Metrics

/// `compress` counters. The compression ratio is derived rather than recorded:
/// `rate(portico_compress_output_bytes_total) / rate(portico_compress_input_bytes_total)` per
/// route is the fraction of bytes still sent, over any window Prometheus is asked for — a
/// per-response histogram would weigh a 2 KiB and a 2 MiB body the same.
/// Handles are made once per label set; `route` comes from configuration, `result` from `Outcome`.
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

    private struct RouteHandles: Sendable {
        var input: any CounterHandler
        var output: any CounterHandler
        var results: [Outcome: any CounterHandler]
    }

    /// What one shard writes of `RouteHandles`.
    private struct LocalRouteHandles {
        var input: CounterCell
        var output: CounterCell
        var results: [Outcome: CounterCell]
    }

    /// Per route; each thread keeps its own cells (`HandleCache`), so recording takes no lock.
    private let handles: HandleCache<String, RouteHandles, LocalRouteHandles>

    init(factory: any MetricsFactory) {
        handles = HandleCache(make: { route in
            let dimensions = [("route", route)]
            var results: [Outcome: any CounterHandler] = [:]
            for outcome in Outcome.allCases {
                results[outcome] = factory.makeCounter(label: "portico_compress_responses_total",
                                                       dimensions: dimensions + [("result", outcome.rawValue)])
            }
            return RouteHandles(
                input: factory.makeCounter(label: "portico_compress_input_bytes_total", dimensions: dimensions),
                output: factory.makeCounter(label: "portico_compress_output_bytes_total", dimensions: dimensions),
                results: results)
        }, localize: { handles, shard in
            LocalRouteHandles(input: CounterCell(handles.input, shard: shard),
                              output: CounterCell(handles.output, shard: shard),
                              results: handles.results.mapValues { CounterCell($0, shard: shard) })
        })
    }

    func record(route: String?, _ outcome: Outcome, bytesIn: Int = 0, bytesOut: Int = 0) {
        let routeHandles = handles[route ?? ""]
        routeHandles.results[outcome]?.increment()
        if outcome == .compressed {
            countBytes(routeHandles, bytesIn: bytesIn, bytesOut: bytesOut)
        }
    }

    /// The bytes of a compressed stream, counted when it ends (its `compressed` result was
    /// counted when its head went out).
    func countBytes(route: String?, bytesIn: Int, bytesOut: Int) {
        countBytes(handles[route ?? ""], bytesIn: bytesIn, bytesOut: bytesOut)
    }

    private func countBytes(_ handle: LocalRouteHandles, bytesIn: Int, bytesOut: Int) {
        handle.input.increment(by: Int64(bytesIn))
        handle.output.increment(by: Int64(bytesOut))
    }
}
