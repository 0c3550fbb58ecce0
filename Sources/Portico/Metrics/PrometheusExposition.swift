/// The pieces of the Prometheus text exposition (format 0.0.4) the sharded histograms write,
/// byte for byte as swift-prometheus 2.4 writes them: the same name and label-name repairs, the
/// same label-value escaping, the same number formats (`Duration` as `seconds.fraction`,
/// `Double.description`). Tests compare the two outputs.
enum PrometheusExposition {
    /// swift-prometheus's repair of an invalid metric name: a leading digit, and any character
    /// outside `[A-Za-z0-9_:]`, become `_`.
    static func metricName(_ name: String) -> String { repaired(name, allowColon: true) }

    /// The same for a label name, where `:` is not allowed either.
    static func labelName(_ name: String) -> String { repaired(name, allowColon: false) }

    private static func repaired(_ name: String, allowColon: Bool) -> String {
        var first = true
        return String(String.UnicodeScalarView(name.unicodeScalars.map { scalar -> Unicode.Scalar in
            defer { first = false }
            switch scalar {
            case "A"..."Z", "a"..."z", "_": return scalar
            case ":": return allowColon ? scalar : "_"
            case "0"..."9": return first ? "_" : scalar
            default: return "_"
            }
        }))
    }

    /// `a="x",b="y"` (no braces), values escaped; nil without labels.
    static func labels(_ labels: [(String, String)]) -> [UInt8]? {
        guard !labels.isEmpty else { return nil }
        var bytes: [UInt8] = []
        for (index, (name, value)) in labels.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            bytes.append(contentsOf: labelName(name).utf8)
            bytes.append(contentsOf: #"=""#.utf8)
            for byte in value.utf8 {
                switch byte {
                case UInt8(ascii: "\\"): bytes.append(contentsOf: #"\\"#.utf8)
                case UInt8(ascii: "\""): bytes.append(contentsOf: #"\""#.utf8)
                case UInt8(ascii: "\n"): bytes.append(contentsOf: #"\n"#.utf8)
                default: bytes.append(byte)
                }
            }
            bytes.append(UInt8(ascii: "\""))
        }
        return bytes
    }

    /// `1.0`, `0.00025`, `2.5`: whole seconds, a dot, the fraction without trailing zeros (at
    /// least one digit).
    static func duration(_ duration: Duration) -> String {
        guard duration >= .zero else { return "-" + Self.duration(.zero - duration) }
        let (seconds, attoseconds) = duration.components
        var fraction = String(attoseconds)
        fraction = String(repeating: "0", count: 18 - fraction.count) + fraction
        while fraction.count > 1, fraction.last == "0" { fraction.removeLast() }
        return "\(seconds).\(fraction)"
    }

    static func typeLine(_ name: String, _ type: String, into buffer: inout [UInt8]) {
        buffer.append(contentsOf: "# TYPE \(name) \(type)\n".utf8)
    }

    /// One histogram's series: cumulative `_bucket` lines (`le` from `bounds`, then `+Inf`),
    /// `_sum` and `_count`. `buckets` holds the count in each bucket (not cumulative), one more
    /// than `bounds` (the values above the last bound).
    static func histogram(name: String, labels: [UInt8]?, bounds: [String], buckets: [Int64], sum: String,
                          into buffer: inout [UInt8]) {
        var cumulative: Int64 = 0
        for (index, bound) in bounds.enumerated() {
            cumulative &+= buckets[index]
            bucketLine(name, labels, bound, cumulative, into: &buffer)
        }
        cumulative &+= buckets[bounds.count]
        bucketLine(name, labels, "+Inf", cumulative, into: &buffer)
        seriesLine(name + "_sum", labels, sum, into: &buffer)
        seriesLine(name + "_count", labels, String(cumulative), into: &buffer)
    }

    private static func bucketLine(_ name: String, _ labels: [UInt8]?, _ bound: String, _ count: Int64,
                                   into buffer: inout [UInt8]) {
        buffer.append(contentsOf: name.utf8)
        buffer.append(contentsOf: "_bucket{".utf8)
        if let labels {
            buffer.append(contentsOf: labels)
            buffer.append(UInt8(ascii: ","))
        }
        buffer.append(contentsOf: "le=\"\(bound)\"} \(count)\n".utf8)
    }

    private static func seriesLine(_ name: String, _ labels: [UInt8]?, _ value: String, into buffer: inout [UInt8]) {
        buffer.append(contentsOf: name.utf8)
        if let labels {
            buffer.append(UInt8(ascii: "{"))
            buffer.append(contentsOf: labels)
            buffer.append(UInt8(ascii: "}"))
        }
        buffer.append(contentsOf: " \(value)\n".utf8)
    }
}
