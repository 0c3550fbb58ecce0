/// What the server answers by itself, before or instead of the handler: a closed set, so an
/// application can render each in its own error shape (`ServerConfiguration.refusalResponse`)
/// and tell them apart without reading their words.
public enum ServerRefusal: Sendable, Equatable {
    /// The head's body framing is ambiguous or malformed (RFC 9112 §6): 400. The detail says how.
    case badFraming(String)
    /// The head breaks a rule of RFC 9112 beyond framing (an HTTP/1.1 request without exactly
    /// one `Host`, whitespace in the target): 400. The detail says which.
    case malformedHead(String)
    /// A transfer coding other than `chunked`: 501.
    case unsupportedTransferCoding
    /// The request head is over `maxHeaderBytes`: 431.
    case headTooLarge(limit: Int)
    /// The declared request body is over `maxBodyBytes`: 413.
    case bodyTooLarge(limit: Int)
    /// The server is stopping and runs no more handlers: 503.
    case shuttingDown
    /// The handler did not answer within the request's deadline: 504.
    case deadlineExceeded
    /// The handler's response head does not fit in the connection memory its request left: 502.
    case responseHeadTooLarge
    /// The handler's `101` could not be sent as an upgrade (libmicrohttpd refused it): 500.
    case upgradeFailed

    /// The status the refusal is answered with.
    public var status: Int {
        switch self {
        case .badFraming, .malformedHead: 400
        case .unsupportedTransferCoding: 501
        case .headTooLarge: 431
        case .bodyTooLarge: 413
        case .shuttingDown: 503
        case .deadlineExceeded: 504
        case .responseHeadTooLarge: 502
        case .upgradeFailed: 500
        }
    }

    /// What happened, in words.
    public var message: String {
        switch self {
        case .badFraming(let detail), .malformedHead(let detail): detail
        case .unsupportedTransferCoding: "transfer codings other than chunked are not supported"
        case .headTooLarge(let limit): "request head exceeds the limit of \(limit) bytes"
        case .bodyTooLarge(let limit): "request body exceeds the limit of \(limit) bytes"
        case .shuttingDown: "the server is shutting down"
        case .deadlineExceeded: "the request was not answered within its deadline"
        case .responseHeadTooLarge: "the response head is too large to send"
        case .upgradeFailed: "the connection could not be upgraded"
        }
    }

    /// The default rendering: the status and the message as plain text; the connection closes.
    public static let plainResponse: @Sendable (ServerRefusal, ServerRequest?, _ requestID: String?) -> ServerResponse = { refusal, _, _ in
        ServerResponse(status: refusal.status, headers: [("Content-Type", "text/plain; charset=utf-8")],
                       body: Array("\(refusal.message)\n".utf8), closeConnection: true)
    }
}
