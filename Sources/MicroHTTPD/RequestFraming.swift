/// The body-framing checks libmicrohttpd leaves to the application (RFC 9112 §6), applied to
/// the head before any body byte is read.
///
/// libmicrohttpd looks only at the first `Transfer-Encoding` field and only recognises the
/// exact value `chunked`; any other value makes it read the body until the client closes, and
/// it uses the first of several `Content-Length` fields. Ambiguous framing is how requests are
/// smuggled past one parser and not another, so it is refused outright: the answer closes the
/// connection, as the rest of the bytes cannot be framed.
enum RequestFraming {
    /// The problem with the head's framing, or nil when libmicrohttpd frames it unambiguously.
    static func problem(version: String, headers: [(name: String, value: String)]) -> ServerRefusal? {
        var lengths = 0
        var encodings: [String] = []
        for (name, value) in headers {
            if name.isFieldName("content-length") {
                lengths += 1
            } else if name.isFieldName("transfer-encoding") {
                encodings.append(value)
            }
        }
        if lengths > 1 {
            return bad("more than one Content-Length header")
        }
        guard !encodings.isEmpty else { return nil }
        if version == "HTTP/1.0" {
            return bad("Transfer-Encoding is not allowed in an HTTP/1.0 request")
        }
        if lengths > 0 {
            return bad("both Content-Length and Transfer-Encoding")
        }
        // The one form libmicrohttpd decodes.
        if encodings.count == 1, encodings[0].lowercased() == "chunked" { return nil }

        let codings = encodings.flatMap { $0.split(separator: ",") }
            .map { $0.trimmed([" ", "\t"]).lowercased() }
            .filter { !$0.isEmpty }
        guard codings.last == "chunked", codings.count(where: { $0 == "chunked" }) == 1 else {
            return bad("the final transfer coding must be chunked, applied once")
        }
        if codings.count == 1 {
            // `chunked` spread over empty list elements or fields: valid, but not what libmicrohttpd decodes.
            return bad("Transfer-Encoding must be exactly \"chunked\"")
        }
        return .unsupportedTransferCoding
    }

    private static func bad(_ message: String) -> ServerRefusal {
        .badFraming(message)
    }
}

private extension Substring {
    func trimmed(_ set: Set<Character>) -> String {
        var text = self
        while let first = text.first, set.contains(first) { text.removeFirst() }
        while let last = text.last, set.contains(last) { text.removeLast() }
        return String(text)
    }
}
