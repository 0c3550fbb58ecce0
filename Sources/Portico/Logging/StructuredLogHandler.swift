import Foundation
import Logging
import Synchronization

/// A swift-log handler writing one line per record as JSON or logfmt.
/// Bootstrapped once by the executable; tests pass their own `write` to capture lines.
public struct StructuredLogHandler: LogHandler {
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    private let label: String
    private let format: LoggingConfig.Format
    private let write: @Sendable (String) -> Void

    public init(label: String, format: LoggingConfig.Format, level: Logger.Level,
                write: @escaping @Sendable (String) -> Void = StructuredLogHandler.standardOutput) {
        self.label = label
        self.format = format
        self.logLevel = level
        self.write = write
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        log(level: event.level, message: event.message, metadata: event.metadata)
    }

    public func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?,
                    source: String, file: String, function: String, line: UInt) {
        log(level: level, message: message, metadata: explicit)
    }

    private func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?) {
        var fields: [(String, String)] = [("ts", Self.timestamp()), ("level", level.rawValue), ("msg", message.description)]
        var merged = self.metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { _, new in new } }
        if let explicit { merged.merge(explicit) { _, new in new } }
        for key in merged.keys.sorted() {
            fields.append((key, Self.text(merged[key]!)))
        }
        write(format == .json ? Self.json(fields) : Self.logfmt(fields))
    }

    static func text(_ value: Logger.Metadata.Value) -> String {
        switch value {
        case .string(let string): string
        case .stringConvertible(let convertible): convertible.description
        case .array(let array): "[" + array.map(text).joined(separator: ",") + "]"
        case .dictionary(let dictionary):
            "{" + dictionary.keys.sorted().map { "\($0)=\(text(dictionary[$0]!))" }.joined(separator: ",") + "}"
        }
    }

    static func json(_ fields: [(String, String)]) -> String {
        var line = "{"
        for (index, (key, value)) in fields.enumerated() {
            if index > 0 { line += "," }
            JSON.appendString(key, to: &line)
            line += ":"
            if Self.isJSONNumber(value) { line += value } else { JSON.appendString(value, to: &line) }
        }
        return line + "}\n"
    }

    static func logfmt(_ fields: [(String, String)]) -> String {
        var line = ""
        for (index, (key, value)) in fields.enumerated() {
            if index > 0 { line += " " }
            line += key + "="
            let needsQuotes = value.isEmpty || value.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" || $0 == "\\" || $0.asciiValue.map { $0 < 0x20 } ?? false })
            if needsQuotes { JSON.appendString(value, to: &line) } else { line += value }
        }
        return line + "\n"
    }

    /// Durations and counts stay numbers in JSON.
    static func isJSONNumber(_ value: String) -> Bool {
        guard let first = value.utf8.first, first >= UInt8(ascii: "0") && first <= UInt8(ascii: "9") || first == UInt8(ascii: "-") else { return false }
        guard value.utf8.count < 20, !(value.hasPrefix("0") && value.count > 1 && !value.hasPrefix("0.")) else { return false }
        return Double(value) != nil && value.allSatisfy { $0.isNumber || $0 == "." || $0 == "-" }
    }

    /// RFC 3339 UTC with milliseconds.
    static func timestamp() -> String {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var parts = tm()
        var seconds = now.tv_sec
        gmtime_r(&seconds, &parts)
        let millis = now.tv_nsec / 1_000_000
        func pad(_ value: Int32, _ width: Int) -> String {
            let s = String(value)
            return String(repeating: "0", count: max(0, width - s.count)) + s
        }
        return "\(pad(parts.tm_year + 1900, 4))-\(pad(parts.tm_mon + 1, 2))-\(pad(parts.tm_mday, 2))T"
            + "\(pad(parts.tm_hour, 2)):\(pad(parts.tm_min, 2)):\(pad(parts.tm_sec, 2)).\(pad(Int32(millis), 3))Z"
    }

    /// Writes whole lines to standard output with one `write(2)` each, so lines never interleave.
    public static let standardOutput: @Sendable (String) -> Void = { line in
        var line = line
        line.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let n = Foundation.write(1, bytes.baseAddress! + offset, bytes.count - offset)
                if n <= 0 { break }
                offset += n
            }
        }
    }
}
