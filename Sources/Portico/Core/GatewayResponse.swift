import HTTPTypes

/// A response on its way back through the chain.
public struct GatewayResponse: Sendable {
    public var head: HTTPResponse
    public var body: Body
    /// For a `101` to an upgrade request: the upstream connection that switched protocols,
    /// out of its pool, waiting to be joined to the client's (`UpgradeSession`).
    public var tunnel: UpstreamTunnel?

    public init(head: HTTPResponse, body: Body = .empty) {
        self.head = head
        self.body = body
    }

    public init(status: HTTPResponse.Status, headerFields: HTTPFields = [:], body: Body = .empty) {
        self.head = HTTPResponse(status: status, headerFields: headerFields)
        self.body = body
    }

    public var status: HTTPResponse.Status { head.status }
    public var headerFields: HTTPFields {
        get { head.headerFields }
        // In place: a get-then-set would copy the fields on every change.
        _modify { yield &head.headerFields }
        set { head.headerFields = newValue }
    }
}
