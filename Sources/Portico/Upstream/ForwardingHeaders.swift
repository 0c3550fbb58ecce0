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
        // The scan above is `connectionNamed(fields)`'s own: go straight to the values.
        let named = connectionNamed(connectionValues(fields))
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
        var out = HTTPFields()
        out.reserveCapacity(fields.count + 4)
        forEachUpstreamField(fields, authority: authority, clientAddress: clientAddress, upstreamHost: upstreamHost,
                             preserveHost: preserveHost, proto: proto) { name, value in
            out.append(HTTPField(name: name, value: value))
        }
        return out
    }

    /// `upstreamRequestFields`, one field at a time in order, for a transport that writes its own
    /// header type: one pass over the client's fields, no intermediate `HTTPFields` (whose edits
    /// and lookups by name build an index per request).
    ///
    /// Hop-by-hop fields and those a `Connection` header names are dropped; exactly one `Host`
    /// goes where the client's first one was (first otherwise); `X-Forwarded-For` and `Via`
    /// extend the last such field or are added at the end, as are `X-Forwarded-Proto` and
    /// `X-Forwarded-Host` when missing.
    static func forEachUpstreamField(
        _ fields: HTTPFields, authority: String?, clientAddress: String,
        upstreamHost: String, preserveHost: Bool, proto: String,
        _ emit: (HTTPField.Name, String) -> Void
    ) {
        let named = connectionNamed(fields)
        @inline(__always) func kept(_ field: HTTPField) -> Bool {
            !isHopByHop(field.name.canonicalName) && (named.isEmpty || !named.contains(field.name.canonicalName))
        }
        var firstHost: String?
        var lastForwardedFor = -1, lastVia = -1
        var hasProto = false, hasForwardedHost = false
        for (index, field) in fields.enumerated() where kept(field) {
            switch field.name {
            case host: if firstHost == nil { firstHost = field.value }
            case xForwardedFor: lastForwardedFor = index
            case via: lastVia = index
            case xForwardedProto: hasProto = true
            case xForwardedHost: hasForwardedHost = true
            default: break
            }
        }
        let clientHost = firstHost ?? authority
        let sentHost = preserveHost ? (clientHost ?? upstreamHost) : upstreamHost
        var hostSent = false
        if firstHost == nil {
            emit(host, sentHost)
            hostSent = true
        }
        for (index, field) in fields.enumerated() where kept(field) {
            switch field.name {
            case host:
                if !hostSent { emit(host, sentHost) }
                hostSent = true
            case xForwardedFor where index == lastForwardedFor && !clientAddress.isEmpty:
                emit(xForwardedFor, joined(field.value, clientAddress))
            case via where index == lastVia:
                emit(via, joined(field.value, viaValue))
            default:
                emit(field.name, field.value)
            }
        }
        if lastForwardedFor < 0, !clientAddress.isEmpty { emit(xForwardedFor, clientAddress) }
        if !hasProto { emit(xForwardedProto, proto) }
        if !hasForwardedHost, let clientHost { emit(xForwardedHost, clientHost) }
        if lastVia < 0 { emit(via, viaValue) }
    }

    /// The lower-cased names a `Connection` field lists (hop-by-hop ones aside): empty, without
    /// looking further, when no hop-by-hop field is there (so no `Connection` either).
    private static func connectionNamed(_ fields: HTTPFields) -> Set<String> {
        guard fields.contains(where: { isHopByHop($0.name.canonicalName) }) else { return [] }
        return connectionNamed(connectionValues(fields))
    }

    /// The values of the `Connection` fields, in order. Not `fields[values: .connection]`: a
    /// lookup by name builds an index of all the fields.
    private static func connectionValues(_ fields: HTTPFields) -> some Sequence<String> {
        fields.lazy.filter { $0.name == .connection }.map(\.value)
    }

    /// The lower-cased names these `Connection` values list, hop-by-hop ones aside.
    static func connectionNamed(_ connectionValues: some Sequence<String>) -> Set<String> {
        var named: Set<String> = []
        for value in connectionValues {
            for token in HTTPList(value) {
                let name = token.text.lowercased()
                if !isHopByHop(name) { named.insert(name) }
            }
        }
        return named
    }

    /// A list field's value extended by `value`.
    static func joined(_ existing: String, _ value: String) -> String {
        let trimmed = existing.trimmingWhitespace()
        return trimmed.isEmpty ? value : "\(trimmed), \(value)"
    }

    /// The fields to send back to the client for an upstream response.
    public static func clientResponseFields(_ fields: HTTPFields) -> HTTPFields {
        clientResponseFields(converting: fields.lazy.map { ($0.name, $0.value) },
                             connectionValues: connectionValues(fields),
                             count: fields.count)
    }

    /// `clientResponseFields` for the fields as a transport received them (`count` of them at
    /// most), built in the same pass that converts them: hop-by-hop fields and those a
    /// `Connection` value names are left out, and `Via` extends the last such field or is added
    /// at the end. One pass, because every keep-alive upstream sends a `Connection` field.
    static func clientResponseFields(converting received: some Sequence<(HTTPField.Name, String)>,
                                     connectionValues: some Sequence<String>, count: Int) -> HTTPFields {
        let named = connectionNamed(connectionValues)
        var out = HTTPFields()
        out.reserveCapacity(count + 1)
        var lastVia: Int?
        for (name, value) in received {
            let canonical = name.canonicalName
            if isHopByHop(canonical) || (!named.isEmpty && named.contains(canonical)) { continue }
            if name == via { lastVia = out.count }
            out.append(HTTPField(name: name, value: value))
        }
        if let lastVia {
            let index = out.index(out.startIndex, offsetBy: lastVia)
            out[index] = HTTPField(name: via, value: joined(out[index].value, viaValue))
        } else {
            out.append(HTTPField(name: via, value: viaValue))
        }
        return out
    }
}
