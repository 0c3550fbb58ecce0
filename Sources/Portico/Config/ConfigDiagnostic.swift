/// One problem in a configuration file, located by file, line and key path so a user can go
/// straight to it: `portico.yaml:31 routes[0].upstream: unknown upstream "order"`.
public struct ConfigDiagnostic: Sendable, Equatable, CustomStringConvertible {
    /// The file as the user named it (not made absolute), or the `source` given to the loader.
    public var file: String
    /// 1-based; nil when the problem has no single place (e.g. a missing section).
    public var line: Int?
    /// Key path such as `routes[0].upstream`; empty for whole-file problems.
    public var path: String
    /// Never contains an interpolated value (those may be secrets).
    public var message: String

    public init(file: String, line: Int?, path: String, message: String) {
        self.file = file
        self.line = line
        self.path = path
        self.message = message
    }

    public var description: String {
        let location = line.map { "\(file):\($0)" } ?? file
        return path.isEmpty ? "\(location): \(message)" : "\(location) \(path): \(message)"
    }
}

/// Everything wrong with a configuration, reported at once so a user fixes a file in one
/// pass instead of one error per run.
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    public var diagnostics: [ConfigDiagnostic]

    public init(diagnostics: [ConfigDiagnostic]) {
        self.diagnostics = diagnostics
    }

    /// One diagnostic per line.
    public var description: String {
        diagnostics.map(\.description).joined(separator: "\n")
    }
}

extension StringProtocol {
    /// Double-quoted with control characters escaped, so a stray CR/LF in a value cannot
    /// split or forge lines in an error message.
    var quotedForMessage: String {
        var out = "\""
        for scalar in unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\0": out += "\\0"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    out += "\\u{\(String(scalar.value, radix: 16))}"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out + "\""
    }
}
