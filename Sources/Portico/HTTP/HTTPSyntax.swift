import Foundation

/// HTTP grammar checks (RFC 9110 §5): tokens, safe field values, case-insensitive token
/// comparison. Configuration uses them so a bad header name or a CR/LF in a configured value is
/// refused at load time instead of splitting a response at run time; header parsers use them to
/// read what a peer sent.
enum HTTPSyntax {
    /// Whether a response with `status` carries a body (RFC 9110 §6.4.1): not to a HEAD
    /// request, not 1xx, 204 or 304.
    static func responseHasBody(status: Int, toHead: Bool = false) -> Bool {
        !toHead && status >= 200 && status != 204 && status != 304
    }

    /// RFC 9110 `token`: method names and header field names.
    static func isToken(_ text: String) -> Bool {
        !text.isEmpty && text.unicodeScalars.allSatisfy { scalar in
            scalar.isASCII && (scalar.properties.isAlphabetic || ("0"..."9").contains(scalar)
                || "!#$%&'*+-.^_`|~".unicodeScalars.contains(scalar))
        }
    }

    /// Whether `text` equals `lowercase` with ASCII letters compared case-insensitively, as
    /// tokens are (`No-Cache` is `no-cache`). `lowercase` must be lower-case already. Allocates
    /// nothing, so a header can be searched for a token on a hot path.
    static func equalsIgnoringCase(_ text: some StringProtocol, _ lowercase: String) -> Bool {
        var expected = lowercase.utf8.makeIterator()
        for byte in text.utf8 {
            guard let wanted = expected.next() else { return false }
            let folded = byte &- UInt8(ascii: "A") < 26 ? byte | 0x20 : byte
            if folded != wanted { return false }
        }
        return expected.next() == nil
    }

    /// Field values may not carry CR, LF or NUL (response splitting, truncation).
    static func isSafeFieldValue(_ text: String) -> Bool {
        !text.unicodeScalars.contains { $0 == "\r" || $0 == "\n" || $0 == "\0" }
    }

    /// Headers Portico computes itself; configuring them would desynchronise framing.
    static let framingHeaders: Set<String> = ["content-length", "transfer-encoding", "connection"]

    /// An absolute http(s) URL with a host. Returns the problem, or nil when fine.
    static func urlProblem(_ text: String, allowQuery: Bool) -> String? {
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else {
            return "expected an absolute URL such as http://127.0.0.1:9000"
        }
        guard scheme == "http" || scheme == "https" else { return "scheme must be http or https" }
        guard let host = components.host, !host.isEmpty else { return "URL has no host" }
        if !allowQuery, components.query != nil { return "URL must not have a query" }
        if components.fragment != nil { return "URL must not have a fragment" }
        return nil
    }
}
