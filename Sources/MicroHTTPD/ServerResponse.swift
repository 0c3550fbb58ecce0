/// A response to send. `Content-Length` is computed from the body (or from `headContentLength`
/// for HEAD); `Transfer-Encoding` and `Content-Length` headers given here are not sent.
public struct ServerResponse: Sendable {
    public var status: Int
    /// Header fields in order, duplicates kept.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// For a HEAD request: the length the body would have had (sent as `Content-Length`).
    public var headContentLength: UInt64?
    /// Close the connection after this response.
    public var closeConnection: Bool

    public init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = [],
                headContentLength: UInt64? = nil, closeConnection: Bool = false) {
        self.status = status
        self.headers = headers
        self.body = body
        self.headContentLength = headContentLength
        self.closeConnection = closeConnection
    }

    /// The default answer for failures the server detects itself.
    public static let plainError: @Sendable (Int, String, String) -> ServerResponse = { status, code, message in
        ServerResponse(status: status, headers: [("Content-Type", "text/plain; charset=utf-8")],
                       body: Array("\(code): \(message)\n".utf8), closeConnection: status >= 400 && status != 404)
    }
}
