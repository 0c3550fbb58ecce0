import HTTPTypes
import Instrumentation
import W3CTraceContext

/// The W3C Trace Context fields of a request, as the tracer reads and writes them.
///
/// The tracer is handed only these two fields, never the request's whole header list: what it
/// logs about a carrier can then never hold an `Authorization` value.
struct TraceHeaders: Sendable, CustomStringConvertible {
    var traceparent: String?
    var tracestate: String?

    static let traceparentName = HTTPField.Name("traceparent")!
    static let tracestateName = HTTPField.Name("tracestate")!

    /// The client's fields when its `traceparent` is well-formed; otherwise none (a new trace).
    /// Duplicate `traceparent` fields join with a comma and so are malformed too; `tracestate`
    /// fields join into one list, as the specification allows.
    init(validating fields: HTTPFields) {
        guard let parent = fields[Self.traceparentName] else { return }
        let state = fields[Self.tracestateName]
        guard (try? TraceContext(traceParentHeaderValue: parent, traceStateHeaderValue: state)) != nil else { return }
        traceparent = parent
        tracestate = state
    }

    init() {}

    var description: String { "traceparent: \(traceparent ?? "-"), tracestate: \(tracestate ?? "-")" }

    /// Sets both fields on `fields`: `traceparent` replaced, `tracestate` replaced or removed.
    func write(to fields: inout HTTPFields) {
        fields[Self.traceparentName] = traceparent
        fields[Self.tracestateName] = tracestate
    }
}

struct TraceHeadersExtractor: Extractor {
    func extract(key: String, from carrier: TraceHeaders) -> String? {
        switch key {
        case "traceparent": carrier.traceparent
        case "tracestate": carrier.tracestate
        default: nil
        }
    }
}

struct TraceHeadersInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout TraceHeaders) {
        switch key {
        case "traceparent": carrier.traceparent = value
        case "tracestate": carrier.tracestate = value
        default: break
        }
    }
}
