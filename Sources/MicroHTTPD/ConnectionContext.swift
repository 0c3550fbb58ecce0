import CMicroHTTPD
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// State of one client connection, created and destroyed by libmicrohttpd's connection
/// notifications (so it is released however the connection ends). Only ever touched on the
/// libmicrohttpd thread that owns the connection, so it needs no lock and is not `Sendable`;
/// the part the watchdog reads from another thread is `timer`.
final class ConnectionContext {
    /// The request being read, from its request line on.
    var request: RequestInProgress?
    /// Set from the handover to the handler until the response is queued (or the request is abandoned).
    var pending: PendingResponse?
    /// A handler's answer queued and not sent yet (its request not completed): `stop` waits
    /// for these, as `MHD_stop_daemon` would drop them unsent.
    var answerUnsent = false
    /// A streamed request body still arriving.
    var upload: Upload?
    /// A streamed response being sent.
    var streaming: StreamingResponse?
    /// A queued 101 whose head is not yet sent (`queueUpgrade`), and then the upgraded connection.
    var upgradeHandoff: UpgradeHandoff?
    var upgraded: UpgradedConnection?
    /// The TLS relay's buffers given to libmicrohttpd (`portico_mhd_widen_tls_relay`): freed at
    /// the close notification, which comes after libmicrohttpd freed the handle using them.
    var relayBuffer: UnsafeMutableRawPointer?
    let clientAddress: String
    let timer: ConnectionTimer
    /// Suspends and resumes this connection (`nil` only without a connection pointer).
    let suspension: Suspension?
    /// The daemon thread's share of the server this connection belongs to (its handler tasks
    /// run on the shard's paired executor).
    let shard: DaemonShard

    init(clientAddress: String, timer: ConnectionTimer, suspension: Suspension?, shard: DaemonShard) {
        self.clientAddress = clientAddress
        self.timer = timer
        self.suspension = suspension
        self.shard = shard
    }
}

/// A streamed request body on its way from the client to the handler's sink.
final class Upload {
    /// `nil` once nobody reads it: the rest of the body is read and dropped.
    var sink: (any RequestBodySink)?
    /// Bytes received so far (against `maxBodyBytes`).
    var received = 0
    /// Given to the sink: wakes a connection parked because the sink was full.
    let resume: @Sendable () -> Void
    private let started = ContinuousClock.now
    /// Time spent parked (the reader's fault, not the client's), and since when it is parked.
    private var parked: Duration = .zero
    private var parkedSince: ContinuousClock.Instant?

    /// The slowest average a streamed body may arrive at, once its first `requestTimeout` is
    /// over: a client dribbling a byte now and then (slowloris) is cut off, any real upload is not.
    static let minimumRate = 1024

    init(sink: (any RequestBodySink)?, resume: @escaping @Sendable () -> Void) {
        self.sink = sink
        self.resume = resume
    }

    /// The connection is parked from now (the sink is full).
    func park() {
        parkedSince = .now
    }

    /// When the rest of the body must have arrived by, at this pace: `requestTimeout`, plus a
    /// second per `minimumRate` bytes received, plus time parked.
    func deadline(requestTimeout: Duration) -> ContinuousClock.Instant {
        if let since = parkedSince {
            parked += since.duration(to: .now)
            parkedSince = nil
        }
        return started + parked + requestTimeout + .seconds(Double(received) / Double(Self.minimumRate))
    }
}

/// A request while its head and body arrive.
final class RequestInProgress {
    let target: String
    let startedAt: ContinuousClock.Instant
    var headersSeen = false
    var headers: [(name: String, value: String)] = []
    var headBytes = 0
    var body: [UInt8] = []

    init(target: String, startedAt: ContinuousClock.Instant) {
        self.target = target
        self.startedAt = startedAt
    }
}

/// How long a connection may take to deliver what it owes: its request head, or its body.
/// libmicrohttpd's own timeout is for inactivity, which a client sending a byte now and then
/// (slowloris) never triggers; the watchdog checks these deadlines and shuts such sockets down.
///
/// The deadline is re-armed several times a request on the connection's own thread and read by
/// its shard's watchdog, so it is an atomic; the lock guards only the duplicate descriptor's
/// life (taken when the connection opens and closes, when it expires, and for the hang-up
/// watch), never per request.
final class ConnectionTimer: Sendable {
    enum Phase: Int, Sendable {
        /// Waiting for a request head (from accept, or after the previous response).
        case head
        /// The head arrived; waiting for the body.
        case body
    }

    /// `MonotonicTime` nanoseconds; `MonotonicTime.never` for none.
    private let deadline: Atomic<Int64>
    private let phase = Atomic<Int>(Phase.head.rawValue)

    private struct Descriptor {
        var closed = false
        /// Our own duplicate of the connection's descriptor (or -1), closed when the connection
        /// closes. Shutting it down shuts the socket down for libmicrohttpd too, and since the
        /// number is ours until we close it, it can never name another socket the process opened since.
        var socket: Int32 = -1
        /// The epoll set `socket` is in while its request is suspended (`HangUpWatch`).
        var hangUpWatch: HangUpWatch?
    }

    private let descriptor = Mutex(Descriptor())

    init(deadline: ContinuousClock.Instant) {
        self.deadline = Atomic(MonotonicTime.nanoseconds(deadline))
    }

    deinit {
        descriptor.withLock { state in
            if !state.closed && state.socket >= 0 { close(state.socket) }
        }
    }

    /// Takes a duplicate of the connection's descriptor, for `expire` to shut down. Called once,
    /// when the connection is admitted (a refused one never costs a second descriptor).
    func watch(_ socket: Int32) {
        guard socket >= 0 else { return }
        let duplicate = dup(socket)
        descriptor.withLock { state in
            if state.closed {
                if duplicate >= 0 { close(duplicate) }
            } else {
                state.socket = duplicate
            }
        }
    }

    /// Sets (or with `nil`, clears) the deadline for `phase`.
    func arm(_ phase: Phase, until deadline: ContinuousClock.Instant?) {
        self.phase.store(phase.rawValue, ordering: .relaxed)
        self.deadline.store(deadline.map(MonotonicTime.nanoseconds) ?? MonotonicTime.never, ordering: .relaxed)
    }

    /// Brings the deadline forward to `deadline` if it is later (a request line arrived).
    func tighten(to deadline: ContinuousClock.Instant) {
        let wanted = MonotonicTime.nanoseconds(deadline)
        var current = self.deadline.load(ordering: .relaxed)
        // No deadline (`never`) counts as the latest: it is set.
        while current > wanted {
            let (exchanged, found) = self.deadline.compareExchange(expected: current, desired: wanted, ordering: .relaxed)
            if exchanged { return }
            current = found
        }
    }

    /// The connection is over (its close notification, or the server stopped): no more deadline,
    /// and the duplicate descriptor is closed.
    func markClosed() {
        deadline.store(MonotonicTime.never, ordering: .relaxed)
        descriptor.withLock { state in
            guard !state.closed else { return }
            state.closed = true
            if state.socket >= 0 {
                // Out of the epoll set first: closing our duplicate would not remove it.
                if let watch = state.hangUpWatch { removeFromEpoll(watch, socket: state.socket) }
                state.hangUpWatch = nil
                close(state.socket)
            }
        }
    }

    /// Adds the descriptor to `watch`'s epoll set with `token`, unless the connection is closed.
    func watchHangUp(in watch: HangUpWatch, token: UInt64) {
        descriptor.withLock { state in
            guard !state.closed, state.socket >= 0, state.hangUpWatch == nil else { return }
            var event = epoll_event()
            event.events = HangUpWatch.events
            event.data.u64 = token
            if epoll_ctl(watch.descriptor, EPOLL_CTL_ADD, state.socket, &event) == 0 { state.hangUpWatch = watch }
        }
    }

    /// Takes the descriptor out of the epoll set it is in, if any.
    func unwatchHangUp() {
        descriptor.withLock { state in
            guard let watch = state.hangUpWatch else { return }
            state.hangUpWatch = nil
            if !state.closed && state.socket >= 0 { removeFromEpoll(watch, socket: state.socket) }
        }
    }

    private func removeFromEpoll(_ watch: HangUpWatch, socket: Int32) {
        var event = epoll_event()
        _ = epoll_ctl(watch.descriptor, EPOLL_CTL_DEL, socket, &event)
    }

    /// Shuts the socket down (its client has left): libmicrohttpd's next read or write fails and
    /// it closes the connection.
    func shutDown() {
        descriptor.withLock { state in
            guard !state.closed, state.socket >= 0 else { return }
            _ = Glibc.shutdown(state.socket, Int32(SHUT_RDWR))
        }
    }

    /// Shuts the socket down when its deadline has passed; returns the phase it was in.
    func expire(now: ContinuousClock.Instant) -> Phase? {
        let current = deadline.load(ordering: .relaxed)
        // Checked without the lock first: almost every connection is within its deadline.
        guard current != MonotonicTime.never, MonotonicTime.nanoseconds(now) >= current else { return nil }
        let phase = Phase(rawValue: self.phase.load(ordering: .relaxed)) ?? .head
        return descriptor.withLock { state -> Phase? in
            // Re-armed meanwhile (a request line arrived): not expired after all.
            guard !state.closed, state.socket >= 0,
                  deadline.compareExchange(expected: current, desired: MonotonicTime.never, ordering: .relaxed).exchanged
            else { return nil }
            // libmicrohttpd sees the socket fail on its next read or write and closes the connection.
            _ = Glibc.shutdown(state.socket, Int32(SHUT_RDWR))
            return phase
        }
    }
}
