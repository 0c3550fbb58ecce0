/// One request as the client sent it. Generic: knows nothing about gateways.
public struct ServerRequest: Sendable {
    public var method: String
    /// The request target exactly as received (not percent-decoded), e.g. `/a%2Fb?x=1+2`.
    public var target: String
    /// `HTTP/1.1` or `HTTP/1.0`.
    public var version: String
    /// Header fields in order, duplicates kept.
    public var headers: [(name: String, value: String)]
    /// The client's address as text.
    public var clientAddress: String
    /// The whole body, for a request whose body is buffered (see `streamedBody`).
    public var body: [UInt8]
    /// Set when the body streams instead (larger than `bufferedBodyBytes`, or chunked): the
    /// handler is asked as soon as the head is in, and returns a sink for the body with its
    /// `.later` answer. `length` is the declared `Content-Length`, if any.
    public var streamedBody: StreamedBody?

    public struct StreamedBody: Sendable, Equatable {
        public var length: Int?

        public init(length: Int?) {
            self.length = length
        }
    }
    /// When the server will answer on the handler's behalf.
    public var deadline: ContinuousClock.Instant
    /// The daemon thread that read it (0-based): its work runs on `ServerConfiguration.taskExecutors`
    /// at this index, so a handler keeps per-thread state by it without sharing it between threads.
    public var thread: Int = 0

    public init(method: String, target: String, version: String = "HTTP/1.1",
                headers: [(name: String, value: String)] = [], clientAddress: String = "",
                body: [UInt8] = [], streamedBody: StreamedBody? = nil,
                deadline: ContinuousClock.Instant = .now.advanced(by: .seconds(30)), thread: Int = 0) {
        self.thread = thread
        self.streamedBody = streamedBody
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.clientAddress = clientAddress
        self.body = body
        self.deadline = deadline
    }

    /// The first value of a header, matched case-insensitively.
    public func header(_ name: String) -> String? {
        headers.first { $0.name.equalsIgnoringASCIICase(name) }?.value
    }
}
