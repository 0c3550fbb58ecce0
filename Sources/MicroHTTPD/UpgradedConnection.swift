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
    /// On a TLS listener, the size of libmicrohttpd's relay buffer each way (`tlsRelayBufferBytes`),
    /// where this libmicrohttpd's layout is one Portico can read; otherwise nil.
    public let tlsRelayBytes: Int?
    private let handle: OpaquePointer
    private let closed = Atomic<Bool>(false)
    let handler: any ConnectionUpgradeHandler
    /// On a TLS listener: the client's connection, watched for the client leaving (`clientLeft`).
    let hangUpTimer: ConnectionTimer?
    /// On a TLS listener: the server's own duplicate of the socketpair end, to shut down when
    /// the client leaves (-1 once released at the connection's close notification).
    private let relayEnd: Mutex<Int32>

    init(handle: OpaquePointer, socket: Int32, received: [UInt8], thread: Int, isTLS: Bool, tlsRelayBytes: Int?,
         hangUpTimer: ConnectionTimer?, handler: any ConnectionUpgradeHandler) {
        self.handle = handle
        self.socket = socket
        self.received = received
        self.thread = thread
        self.isTLS = isTLS
        self.tlsRelayBytes = tlsRelayBytes
        self.hangUpTimer = isTLS && socket >= 0 ? hangUpTimer : nil
        self.relayEnd = Mutex(self.hangUpTimer != nil ? dup(socket) : -1)
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

    /// The connection's close notification: the server's duplicate of the socketpair end goes.
    func releaseRelayEnd() {
        relayEnd.withLock { descriptor in
            if descriptor >= 0 { Glibc.close(descriptor) }
            descriptor = -1
        }
    }
}

/// The client leaving an upgraded TLS connection. libmicrohttpd 0.9.75's relay reads the TLS
/// side's end (a FIN, a reset) but does not pass it on to the socketpair until the application
/// writes, so a handler would wait for bytes that never come. The hang-up watch sees the client's
/// socket go; the server then shuts down its sending side of the socketpair, as if the
/// application had finished: libmicrohttpd forwards what it still holds, ends the relay and
/// shuts its end down, and the handler reads the end of the stream after the last byte, as it
/// does on a plain listener.
extension UpgradedConnection: HangUpListener {
    func clientLeft(timer: ConnectionTimer) -> Bool {
        relayEnd.withLock { descriptor in
            if descriptor >= 0 { _ = Glibc.shutdown(descriptor, Int32(SHUT_WR)) }
        }
        return false
    }

    var isOver: Bool { isClosed }
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

/// The TLS relay's buffer each way: one TLS record's worth (16 KiB of plaintext), so a record
/// crosses in one round. Allocated only for sessions on a TLS listener, freed when they close.
let tlsRelayBufferBytes = 16 * 1024

/// libmicrohttpd's upgrade callback: the 101 head is sent. On the connection's daemon thread.
let mhdUpgradeHandler: MHD_UpgradeHandler = { cls, mhdConnection, _, extraIn, extraInSize, socket, urh in
    guard let cls, let urh else { return }
    let handoff = Unmanaged<UpgradeHandoff>.fromOpaque(cls).takeUnretainedValue()
    handoff.delivered = true
    var received: [UInt8] = []
    if let extraIn, extraInSize > 0 {
        received = Array(UnsafeRawBufferPointer(start: extraIn, count: extraInSize))
    }
    let shard = handoff.shard
    let isTLS = shard.configuration.tls != nil
    var relayBytes: Int?
    if isTLS, let mhdConnection {
        // libmicrohttpd 0.9.75–0.9.77 would relay 4 bytes at a time (see the shim): widened here,
        // before its first relay round, on the thread that runs them.
        let size = portico_mhd_widen_tls_relay(urh, mhdConnection, socket, tlsRelayBufferBytes, &handoff.context.relayBuffer)
        relayBytes = size >= 0 ? size : nil
    }
    let duplicate = socket >= 0 ? dup(socket) : -1
    let connection = UpgradedConnection(handle: urh, socket: duplicate, received: received, thread: shard.index,
                                        isTLS: isTLS, tlsRelayBytes: relayBytes, hangUpTimer: handoff.context.timer,
                                        handler: handoff.handler)
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
