import CMicroHTTPD

#if canImport(Glibc)
import Glibc
#endif

/// A small async HTTP/1.1 server over libmicrohttpd.
///
/// libmicrohttpd's threads never wait on Swift work. When a request is complete they ask the
/// handler for an `Answer`: one it can give at once (a cache hit, an error) is queued right
/// there, on the connection's own thread; for any other the connection is suspended and a task
/// runs the handler's work, whose answer resumes the connection for the next handler call to
/// queue.
public final class HTTPServer: Sendable {
    public typealias Handler = @Sendable (ServerRequest) async -> ServerResponse

    /// How a request is answered.
    public enum Answer: Sendable {
        /// Answered already: queued at once, on libmicrohttpd's thread, with no task and no
        /// suspension.
        case now(ServerResponse)
        /// Answered by this work, run in a task while the connection is suspended. `requestID`
        /// (the handler's own name for the request) is passed to `refusalResponse` when the
        /// server answers instead: past the deadline, or while stopping. For a request with a
        /// `streamedBody`, `upload` takes the body as it arrives (without one it is discarded).
        case later(Work, requestID: String? = nil, upload: (any RequestBodySink)? = nil)
    }

    /// The work that answers a request, run in a task of its own. It runs where that task does,
    /// on the executor given by `ServerConfiguration.taskExecutors` (`nonisolated(nonsending)`:
    /// no executor switch on the way in and out).
    public typealias Work = nonisolated(nonsending) @Sendable () async -> ServerResponse

    /// Called on a libmicrohttpd thread for every complete request (for a streamed body, as
    /// soon as its head is in). It must not block or wait:
    /// whatever cannot be answered straight away is returned as `.later` work.
    public typealias Answering = @Sendable (ServerRequest) -> Answer

    let core: ServerCore

    public init(configuration: ServerConfiguration, answering: @escaping Answering) {
        core = ServerCore(configuration: configuration, answering: answering)
    }

    /// A server whose every request is answered by `handler` in a task.
    public convenience init(configuration: ServerConfiguration, handler: @escaping Handler) {
        self.init(configuration: configuration) { (request: ServerRequest) -> Answer in
            .later { await handler(request) }
        }
    }

    /// Binds and starts serving; returns the bound port (the kernel's choice when the configured port is 0).
    @discardableResult
    public func start() throws(MicroHTTPDError) -> UInt16 {
        try core.start()
    }

    /// The bound port (0 before `start`).
    public var port: UInt16 { core.port }

    /// Requests whose handlers are running.
    public var inFlightRequests: Int { core.inFlightCount }

    /// Responses whose bodies are streaming to their clients.
    public var activeStreams: Int { core.streamCount }

    /// Clients noticed leaving while their request was suspended, whose handlers' tasks were
    /// cancelled (libmicrohttpd itself does not watch a suspended connection).
    public var clientHangUps: Int { core.shards.reduce(0) { $0 + $1.hangUps } }

    /// Upgraded connections (`ServerResponse.Payload.upgrade`) still open.
    public var upgradedConnections: Int { core.upgradeCount }

    /// The libmicrohttpd this process runs on (`MHD_get_version`), e.g. "0.9.75".
    public static var libraryVersion: String { MHD_get_version().map { String(cString: $0) } ?? "unknown" }

    /// Whether this libmicrohttpd can hand a connection over after a 101 (`MHD_FEATURE_UPGRADE`).
    public static var upgradeSupported: Bool { MHD_is_feature_supported(portico_feature_upgrade) == portico_yes }

    /// Where the server is in its life.
    public var lifecycle: ServerLifecycle { core.lifecycle }

    /// Keeps accepting and serving, but asks every client to close its connection after its
    /// answer (`ServerLifecycle.draining`). Returns false when the server was not running. Any thread.
    @discardableResult
    public func beginDraining() -> Bool {
        core.advance(from: .running, to: .draining)
    }

    /// Open client connections.
    public var openConnections: Int { core.openConnectionsPerThread.reduce(0, +) }

    /// libmicrohttpd daemon threads, each paired with `ServerConfiguration.taskExecutors[i]`.
    public var threads: Int { core.shards.count }

    /// Open client connections by thread (connections are dealt to the threads in turn).
    public var openConnectionsPerThread: [Int] { core.openConnectionsPerThread }

    /// Stops accepting, lets in-flight requests finish for up to `grace`, answers those still
    /// running with 503, then stops the daemons. Idempotent; any thread; the first call does the work.
    ///
    /// `listenerClosed` runs as soon as the listening socket is closed, before open connections
    /// are drained: what must take the port over at once (a test server reserving it) does it there.
    public func stop(grace: Duration = .seconds(10), listenerClosed: () -> Void = {}) async {
        await core.stop(grace: grace, listenerClosed: listenerClosed)
    }
}

