import HTTPTypes

/// Header edits that follow from changing a response's content coding, shared by the
/// `compress` middleware and the URLSession transport's re-encoding.
enum CodingHeaders {
    /// Digests of the bytes on the wire no longer hold once the coding changes
    /// (RFC 9530 `Content-Digest`/`Repr-Digest` cover the encoded form; the legacy ones too).
    static let digestFields: [HTTPField.Name] = ["Content-MD5", "Content-Digest", "Repr-Digest", "Digest"]
        .compactMap { HTTPField.Name($0) }

    /// A strong `ETag` names exact bytes, and a different coding has different bytes: it
    /// becomes weak (`W/"x"`), which still matches the original in weak comparison
    /// (`If-None-Match`), so revalidation keeps working. A malformed value cannot be weakened
    /// and is dropped rather than left claiming the new bytes.
    static func weakenETag(_ fields: inout HTTPFields) {
        guard let etag = fields[.eTag] else { return }
        if etag.hasPrefix("W/") { return }
        fields[.eTag] = etag.hasPrefix("\"") ? "W/" + etag : nil
    }

    static func dropDigests(_ fields: inout HTTPFields) {
        for name in digestFields { fields[name] = nil }
    }

    /// Adds `Accept-Encoding` to `Vary`, merging all `Vary` lines into one and dropping
    /// duplicate names (case-insensitively). `Vary: *` already covers it and is left alone.
    static func addVaryAcceptEncoding(_ fields: inout HTTPFields) {
        var names: [String] = []
        for value in fields[values: .vary] {
            for element in HTTPList(value) {
                let name = String(element.text)
                if name == "*" { return }
                if !names.contains(where: { $0.lowercased() == name.lowercased() }) {
                    names.append(name)
                }
            }
        }
        if names.contains(where: { $0.lowercased() == "accept-encoding" }), fields[values: .vary].count == 1 { return }
        if !names.contains(where: { $0.lowercased() == "accept-encoding" }) { names.append("Accept-Encoding") }
        fields[.vary] = names.joined(separator: ", ")
    }

    /// `Cache-Control: no-transform` (RFC 9111 §5.2.1.6, §5.2.2.6): intermediaries must not
    /// change the content. Request or response, any field line, any case.
    static func forbidsTransform(_ fields: HTTPFields) -> Bool {
        fields[values: .cacheControl].contains { CacheControl.lists(.noTransform, in: $0) }
    }
}
