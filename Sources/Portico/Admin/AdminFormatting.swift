import Foundation

extension Duration {
    /// Seconds as a `Double`, for JSON and ratios.
    var secondsValue: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }

    /// Written as the configuration writes it: `250ms`, `10s`, `1.5s`, `5m`.
    var configText: String {
        let milliseconds = secondsValue * 1000
        if milliseconds < 1000 { return "\(Self.trimmed(milliseconds))ms" }
        let seconds = milliseconds / 1000
        if seconds >= 60, seconds.truncatingRemainder(dividingBy: 60) == 0 { return "\(Int(seconds / 60))m" }
        return "\(Self.trimmed(seconds))s"
    }

    private static func trimmed(_ value: Double) -> String {
        value == value.rounded() ? String(Int(value)) : String(format: "%.3g", value)
    }
}

/// JSON for the admin endpoints: snake_case keys as declared, sorted, slashes unescaped.
enum AdminJSON {
    static func encode(_ value: some Encodable) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // The values are plain structs of strings and numbers: encoding cannot fail.
        return Array((try? encoder.encode(value)) ?? Data("{}".utf8)) + [UInt8(ascii: "\n")]
    }
}

/// A value that is one JSON string: a verdict's code, an outcome's sentence.
public protocol EncodedAsString: Encodable {
    var encodedString: String { get }
}

extension EncodedAsString {
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(encodedString)
    }
}

/// Byte sizes as people read them: `16MiB`, `1.5KiB`, `512B`.
func byteSizeText(_ bytes: Int) -> String {
    let units = ["B", "KiB", "MiB", "GiB"]
    var value = Double(bytes)
    var unit = 0
    while value >= 1024, unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return value == value.rounded() ? "\(Int(value))\(units[unit])" : String(format: "%.1f", value) + units[unit]
}
