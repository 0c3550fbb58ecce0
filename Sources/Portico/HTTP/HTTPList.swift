/// The elements of a list-based field value (RFC 9110 §5.6.1, the `#rule`): the one parser for
/// every header that is a list (`Cache-Control`, `Vary`, `Connection`, `Accept-Encoding`,
/// `If-None-Match`, `Content-Encoding`, …).
///
/// - Elements are separated by commas; OWS around them is not part of them; empty elements
///   (`a,,b`, a leading or trailing comma, an all-blank value) are skipped.
/// - A quoted-string is one piece of its element: a comma or semicolon inside it separates
///   nothing, and a backslash escapes the next byte (`"a\"b,c"`). The quotes and escapes are
///   kept in `Element.text`; `unquoted(_:)` removes them. An unterminated quote runs to the end
///   of the value (less trailing OWS).
/// - Each element may carry `;` parameters (§5.6.6), read on demand through `Element.parameters`.
///
/// Iterating allocates nothing: elements are slices of the value, so a caller that only
/// searches a header (`Pragma: no-cache`) pays no more than the scan. Several field lines of
/// one field form one list: iterate each line's `HTTPList` in order.
public struct HTTPList: Sequence, Sendable {
    /// How quotes are read.
    public enum Quoting: Sendable {
        /// RFC 9110 quoted-string: `\` escapes the next byte.
        case quotedString
        /// RFC 9110 §8.8.3 entity-tag: an opaque tag between quotes, where `\` is an ordinary
        /// character (`"a\"` is a whole tag), so `If-None-Match: "a\", "b"` is two tags.
        case entityTag
    }

    /// One non-empty list element.
    public struct Element: Sendable, Equatable {
        /// The element as sent, without surrounding OWS: value and parameters, quotes and
        /// escapes intact. Never empty.
        public let text: Substring
        /// Where the value ends in `text` (the first `;` outside quotes, OWS before it excluded).
        let valueEnd: String.Index
        /// Where the parameters start in `text` (that `;`, or the end).
        let parametersStart: String.Index
        let quoting: Quoting

        /// The part before the first `;` outside quotes, without OWS. Empty for `;q=1`.
        public var value: Substring { text[..<valueEnd] }

        /// The `;` parameters after `value`, in order.
        public var parameters: Parameters { Parameters(text: text[parametersStart...], quoting: quoting) }
    }

    /// One `name=value` parameter of an element (RFC 9110 §5.6.6).
    public struct Parameter: Sendable, Equatable {
        /// Without OWS. Empty for an empty parameter (`gzip;;q=1`, `gzip;`): the grammar allows
        /// those and lenient readers skip them, strict ones (`Accept-Encoding`'s weight) refuse.
        public let name: Substring
        /// After the first `=`, without OWS (recipients accept it around `=`), quotes and
        /// escapes intact; `nil` when there is no `=`.
        public let value: Substring?
    }

    /// The parameters of one element; a `;` inside a quoted value separates nothing.
    public struct Parameters: Sequence, Sendable {
        let text: Substring
        let quoting: Quoting

        public struct Iterator: IteratorProtocol, Sendable {
            let text: Substring
            let quoting: Quoting
            var position: String.Index

            public mutating func next() -> Parameter? {
                let utf8 = text.utf8
                guard position < utf8.endIndex else { return nil }
                // `position` is at a `;`.
                let start = utf8.index(after: position)
                var i = start
                var equals: String.Index?
                while i < utf8.endIndex {
                    let byte = utf8[i]
                    if byte == UInt8(ascii: ";") { break }
                    if byte == UInt8(ascii: "\"") {
                        i = HTTPList.skipQuoted(utf8, from: i, quoting)
                        continue
                    }
                    if byte == UInt8(ascii: "="), equals == nil { equals = i }
                    i = utf8.index(after: i)
                }
                position = i
                guard let equals else {
                    return Parameter(name: HTTPList.trimmed(text[start..<i]), value: nil)
                }
                return Parameter(name: HTTPList.trimmed(text[start..<equals]),
                                 value: HTTPList.trimmed(text[utf8.index(after: equals)..<i]))
            }
        }

        public func makeIterator() -> Iterator {
            Iterator(text: text, quoting: quoting, position: text.startIndex)
        }
    }

    public struct Iterator: IteratorProtocol, Sendable {
        let text: Substring
        let quoting: Quoting
        var position: String.Index

        public mutating func next() -> Element? {
            let utf8 = text.utf8
            while position < utf8.endIndex {
                var i = position
                while i < utf8.endIndex, OWS.contains(utf8[i]) { i = utf8.index(after: i) }
                let start = i
                var end = i  // just past the last byte that is not OWS
                var valueEnd: String.Index?
                var parametersStart: String.Index?
                while i < utf8.endIndex {
                    let byte = utf8[i]
                    if byte == UInt8(ascii: ",") { break }
                    if byte == UInt8(ascii: "\"") {
                        i = HTTPList.skipQuoted(utf8, from: i, quoting)
                        end = i
                        continue
                    }
                    if byte == UInt8(ascii: ";"), parametersStart == nil {
                        valueEnd = end
                        parametersStart = i
                    }
                    i = utf8.index(after: i)
                    if !OWS.contains(byte) { end = i }
                }
                position = i < utf8.endIndex ? utf8.index(after: i) : i
                // An unterminated quote ran to the end, trailing OWS included: not part of it.
                while start < end, OWS.contains(utf8[utf8.index(before: end)]) { end = utf8.index(before: end) }
                if start < end {
                    return Element(text: text[start..<end], valueEnd: valueEnd ?? end,
                                   parametersStart: parametersStart ?? end, quoting: quoting)
                }
            }
            return nil
        }
    }

    let text: Substring
    let quoting: Quoting

    /// The list in one field line.
    public init(_ value: some StringProtocol, quoting: Quoting = .quotedString) {
        text = Substring(value)
        self.quoting = quoting
    }

    public func makeIterator() -> Iterator {
        Iterator(text: text, quoting: quoting, position: text.startIndex)
    }

    /// A quoted-string's content (quotes removed, escapes resolved), up to its closing quote or
    /// the end when unterminated; anything after the closing quote is not part of it. Text that
    /// does not start with a quote is returned as it is.
    public static func unquoted(_ text: some StringProtocol) -> String {
        let utf8 = Substring(text).utf8
        guard utf8.first == UInt8(ascii: "\"") else { return String(text) }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(utf8.count)
        var i = utf8.index(after: utf8.startIndex)
        while i < utf8.endIndex, utf8[i] != UInt8(ascii: "\"") {
            if utf8[i] == UInt8(ascii: "\\") {
                let next = utf8.index(after: i)
                if next < utf8.endIndex { i = next }
            }
            bytes.append(utf8[i])
            i = utf8.index(after: i)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The index just past the quoted section that starts at `quote` (past the end when it is
    /// unterminated).
    @inline(__always)
    static func skipQuoted(_ utf8: Substring.UTF8View, from quote: String.Index, _ quoting: Quoting) -> String.Index {
        var i = utf8.index(after: quote)
        while i < utf8.endIndex {
            let byte = utf8[i]
            if byte == UInt8(ascii: "\"") { return utf8.index(after: i) }
            if byte == UInt8(ascii: "\\"), quoting == .quotedString {
                i = utf8.index(after: i)
                if i == utf8.endIndex { break }
            }
            i = utf8.index(after: i)
        }
        return utf8.endIndex
    }

    /// `text` without leading and trailing OWS, as a slice.
    static func trimmed(_ text: Substring) -> Substring {
        let utf8 = text.utf8
        var start = utf8.startIndex
        var end = utf8.endIndex
        while start < end, OWS.contains(utf8[start]) { start = utf8.index(after: start) }
        while start < end {
            let before = utf8.index(before: end)
            guard OWS.contains(utf8[before]) else { break }
            end = before
        }
        return text[start..<end]
    }
}
