import Foundation
import Yams

extension TracingConfig {
    /// `tracing:` — `endpoint` is required; every other key has a default.
    static func parse(_ m: ConfigMapping) -> TracingConfig? {
        let endpoint = m.required("endpoint")?.url(allowQuery: false)
        // The defaults, read over; the endpoint is set once known to be valid.
        var c = TracingConfig(endpoint: URL(fileURLWithPath: "/"))
        m.read("protocol", into: &c.wireProtocol) { node in
            if case .scalar(let scalar) = node.node, scalar.string == "grpc" {
                node.error("OTLP/gRPC is not built into Portico: use http/protobuf (the collector's port 4318)")
                return nil
            }
            return node.choice(WireProtocol.self)
        }
        m.read("sample_ratio", into: &c.sampleRatio) { $0.ratio() }
        m.read("service_name", into: &c.serviceName) { $0.nonEmptyString() }
        m.read("headers", into: &c.headers) { $0.headerFields(framingSetBy: "the exporter") }
        m.read("timeout", into: &c.timeout) { $0.duration(positive: true) }
        m.read("max_queue_size", into: &c.maxQueueSize) { $0.int(in: 1...1_000_000) }
        m.read("schedule_delay", into: &c.scheduleDelay) { $0.duration(positive: true) }
        m.finish()
        guard let endpoint else { return nil }
        c.endpoint = endpoint
        return c
    }
}

extension ConfigNode {
    /// A number from 0 to 1 (`0.25`), or a percentage (`25%`).
    func ratio() -> Double? {
        guard let value = scalar(expected: "a number from 0 to 1") else { return nil }
        if value.text.hasSuffix("%") { return percentage() }
        guard value.text.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }), let number = Double(value.text),
              (0...1).contains(number) else {
            error("expected a number from 0 to 1 (or a percentage), got \(value.shown)")
            return nil
        }
        return number
    }
}
