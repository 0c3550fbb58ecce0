import Foundation

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

    /// `{ name: value, … }` in order: field names, and values that never appear in a message.
    /// The framing fields are refused: `framingSetBy` writes them.
    func headerFields(framingSetBy writer: String) -> [(String, String)]? {
        guard let headers = mapping() else { return nil }
        var result: [(String, String)] = []
        for entry in headers.entries {
            guard HTTPSyntax.isToken(entry.key) else {
                entry.keyNode.error("invalid header name \(entry.key.quotedForMessage)")
                continue
            }
            if HTTPSyntax.framingHeaders.contains(entry.key.lowercased()) {
                entry.keyNode.error("header \(entry.key.quotedForMessage) is set by \(writer) and cannot be configured")
                continue
            }
            if let value = entry.value.headerValue() { result.append((entry.key, value)) }
        }
        return result
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
