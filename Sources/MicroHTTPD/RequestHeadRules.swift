/// What RFC 9112 requires of a request head beyond its framing, checked here because
/// libmicrohttpd runs with `MHD_OPTION_STRICT_FOR_CLIENT` at 0 (see `HTTPServer`): at 1 it
/// refuses a missing `Host` itself, with a status line written twice, and in its own HTML.
/// A refusal closes the connection, like the framing refusals.
enum RequestHeadRules {
    /// The first problem with the head, framing included, or nil when it is sound.
    static func problem(version: String, target: String, headers: [(name: String, value: String)]) -> ServerRefusal? {
        // RFC 9112 §3.2: a request-target has no whitespace and no control bytes (libmicrohttpd
        // splits the request line at its last space, so `GET /a b HTTP/1.1` arrives as `/a b`).
        if target.utf8.contains(where: { $0 <= 0x20 || $0 == 0x7F }) {
            return .malformedHead("the request target contains whitespace or control bytes")
        }
        // RFC 9112 §3.2: an HTTP/1.1 request has exactly one Host field.
        if version != "HTTP/1.0" {
            let hosts = headers.count(where: { $0.name.isFieldName("host") })
            if hosts != 1 {
                return .malformedHead(hosts == 0 ? "an HTTP/1.1 request needs a Host header" : "more than one Host header")
            }
        }
        return RequestFraming.problem(version: version, headers: headers)
    }
}
