/// How an `HTTPServer` listens and what it allows. A plain value with defaults, passed at `init`.
public struct ServerConfiguration: Sendable {
    /// IPv4 or IPv6 literal to bind; `0.0.0.0` for all IPv4 addresses.
    public var address: String = "127.0.0.1"
    /// 0 asks the kernel for a free port; `HTTPServer.port` reports it.
    public var port: UInt16 = 0
    /// Threads polling connections (libmicrohttpd's thread pool).
    public var threads: Int = 2
    /// A connection opened while this many are open is closed at once, unanswered.
    public var connectionLimit: Int = 1_000
    /// Idle keep-alive connections are closed after this (whole seconds; libmicrohttpd's unit).
    public var idleTimeout: Duration = .seconds(60)
    /// A request must be answered within this, counted from its first byte being parsed.
    /// The handler is told its deadline; the server answers `timeoutResponse` past it.
    public var requestTimeout: Duration = .seconds(30)
    /// A request head (request line and headers) must be complete within this, counted from
    /// the connection's accept or, on a keep-alive connection, from its request line (and at
    /// most `idleTimeout` plus this after the previous response). Slower clients are disconnected.
    /// A request body must be complete within `requestTimeout` of its request line.
    public var headerTimeout: Duration = .seconds(10)
    /// Request line and headers beyond this get 431.
    public var maxHeaderBytes: Int = 32 * 1024
    /// libmicrohttpd's memory per connection: the request head with its field records, then
    /// the response head. It is zeroed before every request, so it is kept tight.
    var connectionMemoryBytes: Int { maxHeaderBytes + 16 * 1024 }
    /// Request bodies beyond this get 413; the rest is not read into memory.
    public var maxBodyBytes: Int = 10 * 1024 * 1024
    /// Kernel accept backlog.
    public var listenBacklog: Int = 1024
    /// Serve HTTPS (libmicrohttpd with GnuTLS); `nil`: plain HTTP.
    public var tls: TLS?
    /// libmicrohttpd's own diagnostics (bind failures, protocol errors); `nil` discards them.
    public var errorLog: (@Sendable (String) -> Void)?
    /// Built-in answers for failures detected before the handler runs (413, 431, 400, timeout).
    public var errorResponse: @Sendable (_ status: Int, _ code: String, _ message: String) -> ServerResponse = ServerResponse.plainError
    /// The answer to a request refused once its head is read, before the handler runs (431, a
    /// declared body over `maxBodyBytes` 413, ambiguous framing 400), given the request as
    /// received (head only, no body): for logging and counting it. `nil`: `errorResponse`.
    public var refusalResponse: (@Sendable (_ request: ServerRequest, _ status: Int, _ code: String,
                                            _ message: String) -> ServerResponse)?

    public init() {}

    /// A certificate chain and its private key, both PEM.
    public struct TLS: Sendable {
        public var certificatePEM: [UInt8]
        public var privateKeyPEM: [UInt8]

        public init(certificatePEM: [UInt8], privateKeyPEM: [UInt8]) {
            self.certificatePEM = certificatePEM
            self.privateKeyPEM = privateKeyPEM
        }
    }
}
