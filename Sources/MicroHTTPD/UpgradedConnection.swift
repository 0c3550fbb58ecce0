import CMicroHTTPD
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What takes a connection over once its `101 Switching Protocols` head has been sent
/// (`ServerResponse.Payload.upgrade`). Generic: knows nothing about WebSocket.
public protocol ConnectionUpgradeHandler: AnyObject, Sendable {
    /// The head is sent and the connection is the handler's: called once, on the daemon thread
    /// that served the request (`UpgradedConnection.thread`). It must not block.
    func upgraded(_ connection: UpgradedConnection)
    /// The server is stopping and its grace is over: the handler ends the session now (says
    /// goodbye in its protocol, then `UpgradedConnection.close`). Any thread; may come more than once.
    func serverStopping()
    /// The 101 was never sent (the client left first, or libmicrohttpd refused the response):
    /// whatever the handler holds for the session is released. Any thread.
    func abandoned()
}

/// An upgraded connection, as libmicrohttpd hands it over (libmicrohttpd 0.9.75,
/// `MHD_response_execute_upgrade_`): it stays libmicrohttpd's — counted as open, toward the
/// listener's `connectionLimit`, until `close` — and the application reads and writes it through
/// `socket`. On a plain listener that is the client's socket; on a TLS listener it is one end of
/// a socketpair that libmicrohttpd's daemon thread relays to the TLS session.
///
/// Ownership: `socket` is a duplicate made for the handler, which closes it itself (never the
/// descriptor libmicrohttpd gave: that one is closed by libmicrohttpd after `close`). `close`
/// calls `MHD_upgrade_action(…, MHD_UPGRADE_ACTION_CLOSE)` once, from any thread
/// (libmicrohttpd resumes the connection under its own lock and cleans it up on its thread);
/// the handler closes its duplicate first, so the peer sees the socket close then.
///
/// `@unchecked Sendable`: the handle is only passed to `MHD_upgrade_action`, once, by the caller
/// that wins `closed`'s exchange; everything else is immutable.
public final class UpgradedConnection: @unchecked Sendable {
    /// The handler's own descriptor for the connection (a `dup` of libmicrohttpd's; -1 if that failed).
    public let socket: Int32
    /// Bytes libmicrohttpd had read past the request head: they come before anything read from `socket`.
    public let received: [UInt8]
    /// The daemon thread that served the request (`ServerRequest.thread`).
    public let thread: Int
    /// Whether the listener terminates TLS (`socket` is then libmicrohttpd's socketpair end).
    public let isTLS: Bool
    private let handle: OpaquePointer
    private let closed = Atomic<Bool>(false)
    let handler: any ConnectionUpgradeHandler

    init(handle: OpaquePointer, socket: Int32, received: [UInt8], thread: Int, isTLS: Bool,
         handler: any ConnectionUpgradeHandler) {
        self.handle = handle
        self.socket = socket
        self.received = received
        self.thread = thread
        self.isTLS = isTLS
        self.handler = handler
    }

    /// Gives the connection back to libmicrohttpd, which closes it. Idempotent; any thread. The
    /// handler has closed `socket` (or handed it to something that did) before calling this.
    public func close() {
        guard !closed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        _ = portico_mhd_upgrade_close(handle)
    }

    /// The daemon is stopping and closes the connection itself: `close` does nothing from now.
    func forgetHandle() {
        closed.store(true, ordering: .releasing)
    }

    public var isClosed: Bool { closed.load(ordering: .acquiring) }
}

/// The response's upgrade handler and what the upgrade callback needs. Held by the connection's
/// context from the moment the 101 is queued (libmicrohttpd's response has no free callback
/// for it): if the connection ends before the head is sent, the handler hears `abandoned`.
final class UpgradeHandoff {
    let handler: any ConnectionUpgradeHandler
    let shard: DaemonShard
    let context: ConnectionContext
    var delivered = false

    init(handler: any ConnectionUpgradeHandler, shard: DaemonShard, context: ConnectionContext) {
        self.handler = handler
        self.shard = shard
        self.context = context
    }
}

/// libmicrohttpd's upgrade callback: the 101 head is sent. On the connection's daemon thread.
let mhdUpgradeHandler: MHD_UpgradeHandler = { cls, _, _, extraIn, extraInSize, socket, urh in
    guard let cls, let urh else { return }
    let handoff = Unmanaged<UpgradeHandoff>.fromOpaque(cls).takeUnretainedValue()
    handoff.delivered = true
    var received: [UInt8] = []
    if let extraIn, extraInSize > 0 {
        received = Array(UnsafeRawBufferPointer(start: extraIn, count: extraInSize))
    }
    let shard = handoff.shard
    let duplicate = socket >= 0 ? dup(socket) : -1
    let connection = UpgradedConnection(handle: urh, socket: duplicate, received: received, thread: shard.index,
                                        isTLS: shard.configuration.tls != nil, handler: handoff.handler)
    handoff.context.upgraded = connection
    shard.upgradeStarted(connection)
    if duplicate < 0 {
        shard.log("could not duplicate an upgraded connection's descriptor: closing it")
        handoff.handler.abandoned()
        connection.close()
        return
    }
    handoff.handler.upgraded(connection)
}
