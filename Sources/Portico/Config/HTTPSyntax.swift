import Foundation

/// The HTTP grammar checks configuration needs, so a bad header name or a CR/LF in a
/// configured value is refused at load time instead of splitting a response at run time.
enum HTTPSyntax {
    /// RFC 9110 `token`: method names and header field names.
    static func isToken(_ text: String) -> Bool {
        !text.isEmpty && text.unicodeScalars.allSatisfy { scalar in
            scalar.isASCII && (scalar.properties.isAlphabetic || ("0"..."9").contains(scalar)
                || "!#$%&'*+-.^_`|~".unicodeScalars.contains(scalar))
        }
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

extension ConfigNode {
    /// A header field name; `lowercased` for lists compared case-insensitively later.
    func headerName(lowercased: Bool = false) -> String? {
        guard let value = scalar() else { return nil }
        guard HTTPSyntax.isToken(value.text) else {
            error("invalid header name \(value.shown)")
            return nil
        }
        return lowercased ? value.text.lowercased() : value.text
    }

    /// A header field value; the message never repeats the value.
    func headerValue() -> String? {
        guard let value = scalar() else { return nil }
        guard HTTPSyntax.isSafeFieldValue(value.text) else {
            error("header value must not contain CR, LF or NUL")
            return nil
        }
        return value.text
    }

    /// An http(s) URL; see `HTTPSyntax.urlProblem`.
    func url(allowQuery: Bool) -> URL? {
        guard let value = scalar() else { return nil }
        // Checked first, and without echoing the URL: it holds a password.
        if let components = URLComponents(string: value.text), components.user != nil || components.password != nil {
            error("URL must not contain a user name or password (put them in credentials:)")
            return nil
        }
        if let problem = HTTPSyntax.urlProblem(value.text, allowQuery: allowQuery) {
            error("invalid URL \(value.shown) (\(problem))")
            return nil
        }
        return URL(string: value.text)
    }
}
