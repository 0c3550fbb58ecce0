/// How an `HTTPServer` listens and what it allows. A plain value with defaults, passed at `init`.
public struct ServerConfiguration: Sendable {
    /// IPv4 or IPv6 literal to bind; `0.0.0.0` for all IPv4 addresses.
    public var address: String = "127.0.0.1"
    /// 0 asks the kernel for a free port; `HTTPServer.port` reports it.
    public var port: UInt16 = 0
    /// libmicrohttpd daemons, each with its own thread; the listener deals connections to them in turn.
    public var threads: Int = 2
    /// Handlers' tasks run on these, dealt to connections in turn: say the event loops the
    /// handlers' own I/O runs on, so a request's work and that I/O share a thread rather than
    /// hopping through the global executor's. Empty: the global concurrent executor.
    public var taskExecutors: [any TaskExecutor] = []
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
    /// Request bodies beyond this get 413 (declared) or are cut (as they flow).
    public var maxBodyBytes: Int = 10 * 1024 * 1024
    /// A body that declares a length up to this is read whole before the handler is asked;
    /// a larger or chunked one streams (`ServerRequest.streamedBody`).
    public var bufferedBodyBytes: Int = 64 * 1024
    /// Kernel accept backlog.
    public var listenBacklog: Int = 1024
    /// Serve HTTPS (libmicrohttpd with GnuTLS); `nil`: plain HTTP.
    public var tls: TLS?
    /// libmicrohttpd's own diagnostics (bind failures, protocol errors); `nil` discards them.
    public var errorLog: (@Sendable (String) -> Void)?
    /// Renders what the server answers by itself (413, 431, 400, 501, 503 while stopping, 504
    /// past the deadline) in the application's error shape. `request` is the head as received
    /// (no body) for a request refused once its head was read, for logging and counting it;
    /// `requestID` the one the handler gave its `.later` answer, for refusals of a request
    /// already handed over (deadline, shutdown).
    public var refusalResponse: @Sendable (_ refusal: ServerRefusal, _ request: ServerRequest?, _ requestID: String?)
        -> ServerResponse = ServerRefusal.plainResponse

    public init() {}

    /// Descriptors kept for everything but client connections: upstream connections, files.
    public static let descriptorReserve = 1024

    /// The descriptors `connectionLimit` client connections need: two each (libmicrohttpd's
    /// socket and the duplicate `ConnectionTimer` shuts down), and `descriptorReserve`.
    public static func descriptorsNeeded(connectionLimit: Int) -> Int {
        2 * max(1, connectionLimit) + descriptorReserve
    }

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
