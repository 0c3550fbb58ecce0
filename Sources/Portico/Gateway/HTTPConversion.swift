import HTTPTypes
import MicroHTTPD
import NIOCore

/// Converting between the server's generic request/response and the gateway's typed ones.
extension GatewayRequest {
    /// Validates what the server received and builds the typed request; malformed input becomes a 400.
    /// With `requestID`, the request carries it as its one `X-Request-ID` (the client's own fields
    /// are replaced), set here rather than afterwards so the fields are built once.
    /// `body`, when given, replaces the server's (a streamed body's `BodyStream`).
    init(validating request: ServerRequest, scheme: String = "http", requestID: String? = nil,
         body: Body? = nil) throws(GatewayError) {
        guard let method = HTTPRequest.Method(request.method) else {
            throw .badRequest("invalid method")
        }
        var fields = HTTPFields()
        fields.reserveCapacity(request.headers.count + 1)
        var host: String?
        var hostCount = 0
        for (name, value) in request.headers {
            guard let fieldName = HTTPField.Name.received(name) else {
                throw .badRequest("invalid header field name")
            }
            guard HTTPField.isReceivedValue(value) else {
                throw .badRequest("invalid characters in header field \(fieldName.canonicalName)")
            }
            if fieldName == ForwardingHeaders.host {
                hostCount += 1
                host = value
            } else if requestID != nil, fieldName == .xRequestID {
                continue
            }
            fields.append(HTTPField(name: fieldName, value: value))
        }
        if let requestID { fields.append(HTTPField(name: .xRequestID, value: requestID)) }
        if hostCount > 1 { throw .badRequest("more than one Host header") }
        if hostCount == 0 && request.version == "HTTP/1.1" { throw .badRequest("missing Host header") }
        let target = try Self.originForm(request.target)
        let head = HTTPRequest(method: method, scheme: scheme, authority: host, path: target, headerFields: fields)
        self.init(head: head, body: body ?? (request.body.isEmpty ? .empty : Body(bytes: request.body)),
                  clientAddress: request.clientAddress, version: request.version)
    }

    /// The target in origin form (`/path?query`). Absolute-form targets are reduced to their
    /// path; dot segments are refused so a route's prefix cannot be escaped.
    static func originForm(_ target: String) throws(GatewayError) -> String {
        var value = target
        if !value.hasPrefix("/") {
            let lower = value.lowercased()
            guard lower.hasPrefix("http://") || lower.hasPrefix("https://") else {
                throw .badRequest("unsupported request target form")
            }
            let afterScheme = value[value.index(value.firstIndex(of: ":")!, offsetBy: 3)...]
            if let slash = afterScheme.firstIndex(where: { $0 == "/" || $0 == "?" }) {
                value = afterScheme[slash] == "?" ? "/" + afterScheme[slash...] : String(afterScheme[slash...])
            } else {
                value = "/"
            }
        }
        // One pass over the bytes: refuse controls and spaces anywhere, and dot segments
        // ("." or "..", also percent-encoded as %2e/%2E) in the path.
        var dots = 0  // dots so far in the current segment; -1 once it holds anything else
        var index = value.utf8.startIndex
        let bytes = value.utf8
        var inPath = true
        while index < bytes.endIndex {
            let byte = bytes[index]
            if byte < 0x21 || byte == 0x7F { throw .badRequest("invalid characters in the request target") }
            if inPath {
                switch byte {
                case UInt8(ascii: "/"), UInt8(ascii: "?"):
                    if dots == 1 || dots == 2 { throw .badRequest("dot segments are not allowed in the request path") }
                    dots = 0
                    if byte == UInt8(ascii: "?") { inPath = false }
                case UInt8(ascii: "."):
                    if dots >= 0 { dots += 1 }
                case UInt8(ascii: "%") where Self.isEncodedDot(bytes, at: index):
                    if dots >= 0 { dots += 1 }
                    index = bytes.index(index, offsetBy: 2)
                default:
                    dots = -1
                }
            }
            index = bytes.index(after: index)
        }
        if inPath && (dots == 1 || dots == 2) { throw .badRequest("dot segments are not allowed in the request path") }
        return value
    }

    /// `%2e` or `%2E` at `index`.
    private static func isEncodedDot(_ bytes: String.UTF8View, at index: String.UTF8View.Index) -> Bool {
        guard let second = bytes.index(index, offsetBy: 1, limitedBy: bytes.endIndex), second < bytes.endIndex,
              let third = bytes.index(index, offsetBy: 2, limitedBy: bytes.endIndex), third < bytes.endIndex
        else { return false }
        return bytes[second] == UInt8(ascii: "2") && (bytes[third] | 0x20) == UInt8(ascii: "e")
    }
}

extension HTTPField {
    /// A received field value: no CR, LF or NUL (other controls are refused too, tab excepted).
    /// Unlike swift-http-types' `isValidValue` it does not insist on trimmed values: what
    /// libmicrohttpd hands over is trimmed already, and a stray edge tab is no reason for a 400.
    static func isReceivedValue(_ value: String) -> Bool {
        value.utf8.allSatisfy { $0 >= 0x20 && $0 != 0x7F || $0 == 0x09 || $0 >= 0x80 }
    }
}

extension ServerResponse {
    /// The wire response for `response`; HEAD answers carry the upstream's Content-Length. With
    /// `requestID`, it is the response's one `X-Request-ID`. A buffered body goes to
    /// libmicrohttpd without a copy; a streamed one is pulled as it flows (with its declared
    /// length, if any, as `Content-Length`; chunked otherwise). A HEAD answer's streamed body is
    /// never read: dropping it cancels its upstream.
    init(_ response: GatewayResponse, isHead: Bool, requestID: String? = nil) {
        var headers: [(name: String, value: String)] = []
        headers.reserveCapacity(response.headerFields.count + 1)
        var contentLength: UInt64?
        for field in response.headerFields {
            if field.name == .contentLength {
                contentLength = UInt64(field.value)
                continue
            }
            if requestID != nil, field.name == .xRequestID { continue }
            headers.append((field.name.rawName, field.value))
        }
        if let requestID { headers.append((HTTPField.Name.xRequestID.rawName, requestID)) }
        let bodiless = !HTTPSyntax.responseHasBody(status: response.status.code, toHead: isHead)
        if response.body.isStreamed {
            let length = response.body.count.map { UInt64($0) }
            self.init(status: response.status.code, headers: headers,
                      payload: bodiless ? .bytes([]) : .stream(StreamedResponseSource(response.body), length: length),
                      headContentLength: isHead ? (contentLength ?? length) : nil)
            return
        }
        let buffer = response.body.buffer ?? ByteBuffer()
        self.init(status: response.status.code, headers: headers,
                  payload: buffer.readableBytes == 0 ? .bytes([]) : .shared(SharedBuffer(buffer)),
                  headContentLength: isHead ? (contentLength ?? UInt64(buffer.readableBytes)) : nil)
    }
}

/// A body buffer lent to libmicrohttpd. The buffer is immutable here, so its bytes stay where
/// they are while libmicrohttpd holds this box (a writer elsewhere copies on write).
final class SharedBuffer: SharedBytes {
    let buffer: ByteBuffer

    init(_ buffer: ByteBuffer) {
        self.buffer = buffer
    }

    func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
        try buffer.withUnsafeReadableBytes(body)
    }
}
