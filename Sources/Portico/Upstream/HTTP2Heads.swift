import NIOHPACK
import NIOHTTP1

/// The heads of `HTTP2StreamsHandler`'s streams, mapped straight between NIO's HTTP/1 head
/// types (what the exchange machine speaks) and HPACK header blocks, as NIOHTTP2's codec did.
extension HTTP2StreamsHandler {
    /// The connection-specific fields HTTP/2 forbids (RFC 9113 §8.2.2), as NIOHTTP2's codec drops them.
    private static let connectionSpecific: Set<String> = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"]

    /// The request head as an HTTP/2 header block: pseudo-header fields first, `Host` as
    /// `:authority`, names lower-cased, the connection-specific fields (and those `Connection`
    /// names) dropped. `TE` never reaches here (`ForwardingHeaders`).
    static func requestHeaders(_ head: HTTPRequestHead, scheme: String) -> HPACKHeaders {
        var headers = HPACKHeaders()
        headers.reserveCapacity(head.headers.count + 4)
        headers.add(name: ":method", value: head.method.rawValue)
        headers.add(name: ":scheme", value: scheme)
        headers.add(name: ":path", value: head.uri)
        if let host = head.headers.first(name: "host") { headers.add(name: ":authority", value: host) }
        let named = head.headers[canonicalForm: "connection"]
        for (name, value) in head.headers {
            let lower = name.utf8.contains(where: { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") }) ? name.lowercased() : name
            if lower == "host" || connectionSpecific.contains(lower) { continue }
            if !named.isEmpty, named.contains(where: { $0.lowercased() == lower }) { continue }
            headers.add(name: lower, value: value)
        }
        return headers
    }

    /// The response head from its header block, as NIOHTTP2's codec made it: version 2.0, the
    /// regular fields, and a body without a length marked chunked (or empty, at END_STREAM).
    static func responseHead(status: Int, _ block: HPACKHeaders, requestIsHead: Bool, endStream: Bool) -> HTTPResponseHead {
        var headers = HTTPHeaders()
        headers.reserveCapacity(block.count)
        var hasLength = false
        for (name, value, _) in block where name.utf8.first != UInt8(ascii: ":") {
            if name == "content-length" { hasLength = true }
            headers.add(name: name, value: value)
        }
        if !hasLength, !(100..<200).contains(status), status != 204, status != 304, !requestIsHead {
            headers.add(name: endStream ? "content-length" : "transfer-encoding", value: endStream ? "0" : "chunked")
        }
        return HTTPResponseHead(version: .init(major: 2, minor: 0), status: HTTPResponseStatus(statusCode: status), headers: headers)
    }
}
