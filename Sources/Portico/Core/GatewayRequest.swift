import HTTPTypes

/// A request on its way through the chain: the head (ordered fields, duplicates kept) and the body.
public struct GatewayRequest: Sendable {
    public var head: HTTPRequest
    public var body: Body
    /// The client's address as text ("127.0.0.1", "::1").
    public var clientAddress: String
    /// The protocol version the client spoke ("HTTP/1.1").
    public var version: String
    /// The protocol this request asks to switch to (`websocket`), set by the gateway only on a
    /// route that opted in (`RouteConfig.upgrade`) for a GET with `Connection: upgrade` and
    /// `Upgrade: TOKEN`: the transport then forwards both fields and may answer with a tunnel
    /// (`GatewayResponse.tunnel`). `nil`: an ordinary request, `Upgrade` dropped as hop-by-hop.
    public var upgrade: String?

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
        if let q = Self.queryStart(target) { return target[..<q] }
        return target[...]
    }
    /// The query without the `?`, if any.
    public var query: Substring? {
        let target = self.target
        guard let q = Self.queryStart(target) else { return nil }
        return target[target.utf8.index(after: q)...]
    }

    /// Where `?` is: a byte search (a `Character` search would walk grapheme clusters).
    private static func queryStart(_ target: String) -> String.Index? {
        target.utf8.firstIndex(of: UInt8(ascii: "?"))
    }
    public var headerFields: HTTPFields {
        get { head.headerFields }
        // In place: a get-then-set would copy the fields on every change.
        _modify { yield &head.headerFields }
        set { head.headerFields = newValue }
    }
}
