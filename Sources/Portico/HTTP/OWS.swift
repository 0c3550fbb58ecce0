/// Optional whitespace (RFC 9110 §5.6.3): `OWS = *( SP / HTAB )`, the only whitespace HTTP
/// allows around list delimiters, parameters and field values.
enum OWS {
    @inline(__always)
    static func contains(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t")
    }
}

extension StringProtocol {
    /// The text without leading and trailing OWS (spaces and tabs; nothing else is trimmed).
    func trimmingWhitespace() -> String {
        var scalars = Substring(self).unicodeScalars[...]
        while let first = scalars.first, first == " " || first == "\t" { scalars.removeFirst() }
        while let last = scalars.last, last == " " || last == "\t" { scalars.removeLast() }
        return String(String.UnicodeScalarView(scalars))
    }
}
