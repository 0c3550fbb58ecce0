import Foundation

/// `tracing:` — OpenTelemetry spans exported over OTLP/HTTP. Absent (the default): no spans, no
/// exporter, and `traceparent`/`tracestate` travel upstream untouched like any end-to-end header.
public struct TracingConfig: Sendable, Equatable {
    /// The OTLP/HTTP encodings; gRPC is not built into Portico.
    public enum WireProtocol: String, Sendable, Equatable, CaseIterable {
        case httpProtobuf = "http/protobuf"
        case httpJSON = "http/json"
    }

    /// The collector's traces URL. A URL without a path gets OTLP's `/v1/traces`.
    public var endpoint: URL
    public var wireProtocol: WireProtocol = .httpProtobuf
    /// The fraction of new traces recorded (`0...1`); a caller's sampling decision is followed.
    public var sampleRatio: Double = 1
    /// The `service.name` resource attribute.
    public var serviceName: String = "portico"
    /// Sent with every export (an API key, say): may come from `${VAR}`; never logged.
    public var headers: [(String, String)] = []
    /// One export call's limit.
    public var timeout: Duration = .seconds(10)
    /// Finished spans waiting for export; past it, spans are dropped and counted in
    /// `portico_trace_spans_dropped_total` — requests never wait for the collector.
    public var maxQueueSize: Int = 2048
    /// The longest a finished span waits before its batch is sent.
    public var scheduleDelay: Duration = .seconds(5)

    public init(endpoint: URL) {
        self.endpoint = endpoint
    }

    /// Where spans are posted: `endpoint`, with `/v1/traces` when it has no path of its own.
    public var tracesURL: String {
        let text = endpoint.absoluteString
        guard endpoint.path.isEmpty || endpoint.path == "/" else { return text }
        return (text.hasSuffix("/") ? String(text.dropLast()) : text) + "/v1/traces"
    }

    public static func == (a: TracingConfig, b: TracingConfig) -> Bool {
        a.endpoint == b.endpoint && a.wireProtocol == b.wireProtocol && a.sampleRatio == b.sampleRatio
            && a.serviceName == b.serviceName && a.headers.elementsEqual(b.headers, by: { $0 == $1 })
            && a.timeout == b.timeout && a.maxQueueSize == b.maxQueueSize && a.scheduleDelay == b.scheduleDelay
    }
}
