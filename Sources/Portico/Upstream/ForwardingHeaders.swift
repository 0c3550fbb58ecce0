import HTTPTypes

/// Header hygiene shared by both transports: pure functions over ordered fields.
/// Everything not named here keeps its position, its duplicates and its case.
public enum ForwardingHeaders {
    public static let host = HTTPField.Name("Host")!
    public static let xForwardedFor = HTTPField.Name("X-Forwarded-For")!
    public static let xForwardedProto = HTTPField.Name("X-Forwarded-Proto")!
    public static let xForwardedHost = HTTPField.Name("X-Forwarded-Host")!
    public static let via = HTTPField.Name("Via")!
    /// The pseudonym this gateway uses in `Via`.
    public static let viaValue = "1.1 portico"

    /// Hop-by-hop fields (RFC 9110 §7.6.1 plus the legacy ones), by lowercased name.
    public static let hopByHop: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "proxy-authenticate",
        "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
    ]

    /// Whether `name` (lower-cased) is in `hopByHop`: by length first, so that the fields of
    /// every request and response are mostly told apart by one comparison, not a hash.
    @inline(__always)
    static func isHopByHop(_ name: String) -> Bool {
        switch name.utf8.count {
        case 2: name == "te"
        case 7: name == "trailer" || name == "upgrade"
        case 10: name == "connection" || name == "keep-alive"
        case 16: name == "proxy-connection"
        case 17: name == "transfer-encoding"
        case 18: name == "proxy-authenticate"
        case 19: name == "proxy-authorization"
        default: false
        }
    }

    /// Removes the hop-by-hop fields and every field a `Connection` header names.
    public static func removingHopByHop(_ fields: HTTPFields) -> HTTPFields {
        // The common case on the hot path: nothing to remove, no copy.
        if !fields.contains(where: { isHopByHop($0.name.canonicalName) }) { return fields }
        var named: Set<String> = []
        for value in fields[values: .connection] {
            for token in HTTPList(value) {
                let name = token.text.lowercased()
                if !isHopByHop(name) { named.insert(name) }
            }
        }
        var kept = HTTPFields()
        kept.reserveCapacity(fields.count)
        for field in fields where !isHopByHop(field.name.canonicalName) {
            if named.isEmpty || !named.contains(field.name.canonicalName) { kept.append(field) }
        }
        return kept
    }

    /// The fields to send upstream for a client request.
    ///
    /// - `clientHost`: the client's `Host` (from the fields, or the request's authority).
    /// - `upstreamHost`: the upstream's `host[:port]`; sent as `Host` unless `preserveHost`.
    public static func upstreamRequestFields(
        _ fields: HTTPFields, authority: String? = nil, clientAddress: String,
        upstreamHost: String, preserveHost: Bool, proto: String = "http"
    ) -> HTTPFields {
        var out = removingHopByHop(fields)
        let clientHost = out.first(where: { $0.name == host })?.value ?? authority
        let sentHost = preserveHost ? (clientHost ?? upstreamHost) : upstreamHost

        // Exactly one Host, where the client had it (first otherwise, as HTTP/1.1 clients send it).
        if let first = out.firstIndex(where: { $0.name == host }) {
            out[first] = HTTPField(name: host, value: sentHost)
            var index = out.index(after: first)
            while index < out.endIndex {
                if out[index].name == host { out.remove(at: index) } else { index = out.index(after: index) }
            }
        } else {
            out.insert(HTTPField(name: host, value: sentHost), at: out.startIndex)
        }

        if !clientAddress.isEmpty {
            appendToList(&out, name: xForwardedFor, value: clientAddress)
        }
        if out[xForwardedProto] == nil {
            out.append(HTTPField(name: xForwardedProto, value: proto))
        }
        if out[xForwardedHost] == nil, let clientHost {
            out.append(HTTPField(name: xForwardedHost, value: clientHost))
        }
        appendToList(&out, name: via, value: viaValue)
        return out
    }

    /// The fields to send back to the client for an upstream response.
    public static func clientResponseFields(_ fields: HTTPFields) -> HTTPFields {
        var out = removingHopByHop(fields)
        appendToList(&out, name: via, value: viaValue)
        return out
    }

    /// Appends `value` to the last field named `name` (a comma-separated list), or adds the field.
    static func appendToList(_ fields: inout HTTPFields, name: HTTPField.Name, value: String) {
        if let last = fields.lastIndex(where: { $0.name == name }) {
            let existing = fields[last].value.trimmingWhitespace()
            fields[last] = HTTPField(name: name, value: existing.isEmpty ? value : "\(existing), \(value)")
        } else {
            fields.append(HTTPField(name: name, value: value))
        }
    }
}
