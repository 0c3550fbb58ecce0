import HTTPTypes

extension HTTPField.Name {
    /// `HTTPField.Name(raw)` for a name received on the wire, from either side. The names most
    /// requests and responses carry, spelled as clients and servers send them, come from
    /// swift-http-types' own constants: no byte-by-byte token check and no lower-cased copy for
    /// each (measured with bench/instructions: ≈ 300 instructions a field). Any other spelling
    /// is validated as usual; `nil` for a name that is not a token.
    static func received(_ raw: String) -> HTTPField.Name? {
        switch raw.utf8.count {
        case 3:
            if raw == "Age" { return .age }
            if raw == "Via" { return .via }
        case 4:
            if raw == "Date" { return .date }
            if raw == "Host" { return ForwardingHeaders.host }
            if raw == "ETag" { return .eTag }
            if raw == "Vary" { return .vary }
        case 6:
            if raw == "Server" { return .server }
            if raw == "Accept" { return .accept }
            if raw == "Cookie" { return .cookie }
            if raw == "Origin" { return .origin }
        case 7:
            if raw == "Expires" { return .expires }
            if raw == "Referer" { return .referer }
        case 8:
            if raw == "Location" { return .location }
        case 10:
            if raw == "Connection" { return .connection }
            if raw == "User-Agent" { return .userAgent }
            if raw == "Set-Cookie" { return .setCookie }
        case 12:
            if raw == "Content-Type" { return .contentType }
        case 13:
            if raw == "Cache-Control" { return .cacheControl }
            if raw == "Last-Modified" { return .lastModified }
            if raw == "Authorization" { return .authorization }
            if raw == "Accept-Ranges" { return .acceptRanges }
            if raw == "If-None-Match" { return .ifNoneMatch }
        case 14:
            if raw == "Content-Length" { return .contentLength }
        case 15:
            if raw == "Accept-Encoding" { return .acceptEncoding }
            if raw == "Accept-Language" { return .acceptLanguage }
        case 16:
            if raw == "Content-Encoding" { return .contentEncoding }
        case 17:
            if raw == "Transfer-Encoding" { return .transferEncoding }
            if raw == "If-Modified-Since" { return .ifModifiedSince }
        default:
            break
        }
        return HTTPField.Name(raw)
    }
}
