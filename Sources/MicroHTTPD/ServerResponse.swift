/// A response to send. `Content-Length` is computed from the body (or from `headContentLength`
/// for HEAD); `Transfer-Encoding` and `Content-Length` headers given here are not sent.
public struct ServerResponse: Sendable {
    public var status: Int
    /// Header fields in order, duplicates kept.
    public var headers: [(name: String, value: String)]
    public var payload: Payload
    /// For a HEAD request: the length the body would have had (sent as `Content-Length`).
    public var headContentLength: UInt64?
    /// Close the connection after this response.
    public var closeConnection: Bool

    /// Where the body's bytes live.
    public enum Payload: Sendable {
        /// Bytes libmicrohttpd copies into its response.
        case bytes([UInt8])
        /// Bytes owned elsewhere, sent without a copy: libmicrohttpd holds the owner until the
        /// response is gone.
        case shared(any SharedBytes)
        /// Bytes that flow while they are sent (`length`: a declared `Content-Length`; without
        /// one the body is sent chunked, or to an HTTP/1.0 client until the connection closes).
        case stream(any ResponseBodySource, length: UInt64?)
        /// No body: a `101 Switching Protocols` whose connection `handler` takes over once the
        /// head is sent (`ConnectionUpgradeHandler`). The headers must include `Connection:
        /// upgrade` and `Upgrade`; the server never adds `Connection: close` to it.
        case upgrade(any ConnectionUpgradeHandler)
    }

    public init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = [],
                headContentLength: UInt64? = nil, closeConnection: Bool = false) {
        self.init(status: status, headers: headers, payload: .bytes(body), headContentLength: headContentLength,
                  closeConnection: closeConnection)
    }

    public init(status: Int, headers: [(name: String, value: String)] = [], payload: Payload,
                headContentLength: UInt64? = nil, closeConnection: Bool = false) {
        self.status = status
        self.headers = headers
        self.payload = payload
        self.headContentLength = headContentLength
        self.closeConnection = closeConnection
    }

    /// The body's bytes (a copy when they are shared).
    public var body: [UInt8] {
        get {
            switch payload {
            case .bytes(let bytes): bytes
            case .shared(let owner): owner.withUnsafeBytes { Array($0) }
            case .stream, .upgrade: []
            }
        }
        set { payload = .bytes(newValue) }
    }
}

/// Immutable bytes owned by an object: a response body libmicrohttpd can send straight from
/// where it already is (a cached response, an upstream's buffer) instead of copying it.
public protocol SharedBytes: AnyObject, Sendable {
    /// Calls `body` with the bytes. They must not change, nor move, while the object lives:
    /// libmicrohttpd keeps reading them after `body` returns, for as long as it holds the object.
    func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result
}
