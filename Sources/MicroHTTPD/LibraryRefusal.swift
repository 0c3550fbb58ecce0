import CMicroHTTPD

#if canImport(Glibc)
import Glibc
#endif

/// Requests libmicrohttpd 0.9.75 refuses by itself once their head is in, answering with its
/// status line and headers written twice (a corrupt response): a `Content-Length` that is not
/// one decimal number, or is beyond 64 bits. Its `parse_connection_headers` queues the error
/// response, and the state machine then builds that response's head a second time.
///
/// No callback of the application runs in between: the one sign is the message libmicrohttpd
/// logs just before, on the connection's own thread. So from that message Portico finds the
/// connection (`ServerCore.answerRefusal`), writes its own answer to the socket and shuts the
/// socket's sending side; libmicrohttpd's doubled answer then fails to send, and it closes the
/// connection. (A missing `Host`, refused on the same path at strict level 1, is checked by
/// `RequestHeadRules` instead, with libmicrohttpd at strict level 0.)
enum LibraryRefusal: Equatable {
    case contentLengthTooLarge
    case contentLengthMalformed

    /// The refusal a libmicrohttpd message announces, if it is one of these.
    init?(message: String) {
        if message.hasPrefix("Too large value of 'Content-Length' header") {
            self = .contentLengthTooLarge
        } else if message.hasPrefix("Failed to parse `Content-Length' header") {
            self = .contentLengthMalformed
        } else {
            return nil
        }
    }

    /// How the server answers it, given its body limit.
    func refusal(maxBodyBytes: Int) -> ServerRefusal {
        switch self {
        case .contentLengthTooLarge: .bodyTooLarge(limit: maxBodyBytes)
        case .contentLengthMalformed: .badFraming("Content-Length must be one decimal number")
        }
    }
}

/// One open connection as its own libmicrohttpd thread can find it again from a callback that
/// names no connection (a log message).
///
/// `@unchecked Sendable`: it sits in the server's shared registry, but `connection` and
/// `context` are only used on `thread`, the connection's own libmicrohttpd thread (checked with
/// `pthread_equal` before any use), and only while it is registered: the close notification
/// removes it before the context is released.
struct ConnectionHandle: @unchecked Sendable {
    let connection: OpaquePointer
    let context: Unmanaged<ConnectionContext>
    let socket: Int32
    let thread: pthread_t
}

extension ServerResponse {
    /// Fields the server writes itself from the body and the connection's fate, never a handler's.
    static func isFramingField(_ name: String) -> Bool {
        name.isFieldName("content-length") || name.isFieldName("transfer-encoding") || name.isFieldName("connection")
    }

    /// The response as HTTP/1.1 bytes, for the rare answer Portico writes to a socket itself.
    /// It closes the connection.
    func serialized(date: String) -> [UInt8] {
        let body = self.body
        let reason = MHD_get_reason_phrase_for(UInt32(status)).map { String(cString: $0) } ?? ""
        var head = "HTTP/1.1 \(status) \(reason)\r\nDate: \(date)\r\nConnection: close\r\nContent-Length: \(body.count)\r\n"
        for (name, value) in headers {
            if Self.isFramingField(name) || name.isFieldName("date") { continue }
            // The same fields libmicrohttpd would refuse are never written.
            guard !name.utf8.contains(where: { $0 <= 0x20 || $0 == UInt8(ascii: ":") || $0 == 0x7F }),
                  !value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else { continue }
            head += "\(name): \(value)\r\n"
        }
        head += "\r\n"
        return Array(head.utf8) + body
    }
}

/// Now as an IMF-fixdate (RFC 9110 §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
func imfFixdateNow() -> String {
    var now = time(nil)
    var parts = tm()
    gmtime_r(&now, &parts)
    var buffer = [CChar](repeating: 0, count: 40)
    let count = strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
    return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
