import HTTPTypes

/// A request on its way through the chain: the head (ordered fields, duplicates kept) and the body.
public struct GatewayRequest: Sendable {
    public var head: HTTPRequest
    public var body: Body
    /// The client's address as text ("127.0.0.1", "::1").
    public var clientAddress: String
    /// The protocol version the client spoke ("HTTP/1.1").
    public var version: String

    public init(head: HTTPRequest, body: Body = .empty, clientAddress: String = "", version: String = "HTTP/1.1") {
        self.head = head
        self.body = body
        self.clientAddress = clientAddress
        self.version = version
    }

    public var method: HTTPRequest.Method { head.method }
    /// The raw request target as the client sent it (path and query, not percent-decoded).
    public var target: String { head.path ?? "/" }
    /// The target without its query.
    public var path: Substring {
        let target = self.target
        if let q = target.firstIndex(of: "?") { return target[..<q] }
        return target[...]
    }
    /// The query without the `?`, if any.
    public var query: Substring? {
        let target = self.target
        guard let q = target.firstIndex(of: "?") else { return nil }
        return target[target.index(after: q)...]
    }
    public var headerFields: HTTPFields {
        get { head.headerFields }
        set { head.headerFields = newValue }
    }
}
