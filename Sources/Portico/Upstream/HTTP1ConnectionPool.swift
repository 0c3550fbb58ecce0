import LockAudit
import NIOCore
import NIOHTTP1
import Synchronization

/// A small HTTP/1.1 connection pool on SwiftNIO: the `nio` transport's, upstreams' and token
/// endpoints' alike. Portico owns it rather than using AsyncHTTPClient's for two
/// reasons: cost (a task's exchange stays on its event loop; measured 25 % less CPU per proxied
/// request), and verification — with `tls.server_name`, the certificate must name `server_name`
/// by DNS name (`ServerNameCheck`), and AsyncHTTPClient builds its `NIOSSLClientHandler`
/// itself, whose host name check also accepts an IP-address name equal to the connected address.
///
/// **One pool per event loop** (issue #33). For each loop of `loops` there is a share of the
/// pool (a `ConnectionPoolStateMachine`) that only that loop touches: its idle connections,
/// opened on that loop, its waiting requests, its timers. A request uses the share of the loop
/// it runs on (`EventLoops.currentIndex`), so leasing and releasing a connection take no lock
/// and write nothing another core reads. A caller on no loop of `loops` (a test, a token fetch)
/// moves onto this pool's home loop for the exchange (`EventLoops.nextHomeIndex`, dealt once
/// per pool), so its requests reuse one loop's connections.
///
/// **The cap is shared.** At most `maxConnections` connections exist at once for the whole
/// upstream, idle ones included: the loops' shares count them in one `SharedCap` (an atomic
/// named `Configuration.capName`, e.g. `upstreams.orders.max_connections`), added to when a
/// connection is to be opened and subtracted from when it closes. It is cheap because it is
/// written per connection, never per request: a request on a reused connection only reads it
/// (one relaxed load when it gives its connection back, to know whether the cap is reached),
/// and a word no core writes stays in every core's cache. A request that finds no idle
/// connection on its loop and the cap reached waits in its loop's queue up to `connectTimeout`
/// (or the exchange's deadline), then fails with `UpstreamError.connectTimeout` (or
/// `.timeout`). Only at the cap do loops talk to each other, so that a slot held or freed on
/// one loop is not invisible to another's waiters: a loop with waiters raises its
/// `WaitingSignal`; a loop that closes a connection tells each loop whose signal is up
/// (`EventLoop.execute`); a loop giving back a reusable connection while the cap is reached and
/// another loop waits closes it rather than keeping it idle; and a loop whose waiter finds
/// nothing idle asks the other loops, one after the other, to close one idle connection of
/// theirs (the least recently used).
///
/// Connections are kept alive unless either side says otherwise, reused last-in first-out on
/// their loop, and closed `idleTimeout` after their last use (one sweep timer per loop), or at
/// `shutdown`.
///
/// **A stale connection** (issue #45): a server closes idle keep-alive connections when it likes
/// (an nginx reload closes them all), and one leased before its loop read the FIN fails with no
/// byte of a response (`StaleConnection`). Such a request goes out once more, on a new
/// connection that takes the failed one's slot (never another idle one, as likely stale, and
/// never behind the cap), within the same deadline: any request found closed before its write,
/// one that may be sent twice after it (`StaleConnection.allowsResend`); `onResend` counts it.
final class HTTP1ConnectionPool: Sendable {
    struct Configuration: Sendable {
        var endpoint: HTTP1Connection.Endpoint
        var maxConnections: Int
        var connectTimeout: Duration
        var idleTimeout: Duration
        /// The name of the shared count of this pool's connections (`SharedCap`), as the
        /// confinement test lists it: `upstreams.NAME.max_connections`.
        var capName: String
        /// A request is sent again after a stale connection (`portico_upstream_stale_retries_total`).
        var onResend: @Sendable () -> Void = {}
    }

    typealias Machine = ConnectionPoolStateMachine<HTTP1Connection, CheckedContinuation<HTTP1Connection?, any Error>>

    /// One loop's share. Its mutable parts are touched only on `loop`: `execute` reaches it from
    /// a task running on that loop (checked with `inEventLoop`, or hopped to with
    /// `EventLoop.execute`), and every callback that reaches it — timers, the response's
    /// `finished` future, the other loops' messages — is scheduled on `loop` (a connection of
    /// this share lives on `loop`, so do its futures). Hence `@unchecked Sendable` without a lock.
    private final class Share: @unchecked Sendable {
        let loop: any EventLoop
        let index: Int
        var machine: Machine
        var sweep: Scheduled<Void>?
        var waiterTimer: Scheduled<Void>?
        /// While requests wait here at the cap: tries the cap again every `recheckInterval`, in
        /// case a slot freed on another loop went unannounced (the cap's count is relaxed).
        var recheck: RepeatedTask?

        init(loop: any EventLoop, index: Int, machine: Machine) {
            self.loop = loop
            self.index = index
            self.machine = machine
        }
    }

    /// How long a request may wait for a connection (a free slot, then connecting), and what
    /// it fails with past that: `connect_timeout` from now, or the exchange's own deadline if sooner.
    private struct Wait {
        var limit: NIODeadline
        var failure: UpstreamError

        init(connectTimeout: Duration, deadline: NIODeadline?) {
            limit = .now() + TimeAmount(connectTimeout)
            failure = .connectTimeout
            if let deadline, deadline < limit { (limit, failure) = (deadline, .timeout) }
        }
    }

    private let configuration: Configuration
    private let loops: EventLoops
    private let shares: [Share]
    /// The share of callers not on one of `loops`.
    private let home: Int
    /// One per share, same order; read by a loop that frees a slot.
    private let signals: [WaitingSignal]
    /// Set once by `retire` or `shutdown`; read per request (never written then, so never contended).
    private let isShutDown = Atomic<Bool>(false)

    init(_ configuration: Configuration, loops: EventLoops) {
        self.configuration = configuration
        self.loops = loops
        let cap = SharedCap(name: configuration.capName)
        let signals = loops.loops.map { _ in WaitingSignal() }
        self.signals = signals
        self.shares = loops.loops.enumerated().map { index, loop in
            Share(loop: loop, index: index,
                  machine: Machine(cap: cap, limit: configuration.maxConnections,
                                   idleTimeout: TimeAmount(configuration.idleTimeout), signals: signals, index: index))
        }
        self.home = loops.nextHomeIndex()
    }

    /// One exchange on a pooled (or new) connection. Errors are `UpstreamError` where a kind
    /// applies; cancellation closes the connection in use and rethrows. A response whose body
    /// streams keeps its connection until the body has ended (or failed).
    nonisolated(nonsending) func execute(_ exchange: HTTP1Exchange) async throws -> HTTP1Response {
        if isShutDown.load(ordering: .relaxed) { throw Machine.shutDownError }
        if let index = loops.currentIndex {
            return try await execute(exchange, on: shares[index])
        }
        return try await executeAtHome(exchange)
    }

    /// `execute` for a caller on none of the loops: the exchange runs on the home loop, as a
    /// task preferring that loop's executor (so every resumption lands there too).
    @concurrent private func executeAtHome(_ exchange: HTTP1Exchange) async throws -> HTTP1Response {
        let share = shares[home]
        return try await withTaskExecutorPreference(loops.executors[home]) {
            try await self.execute(exchange, on: share)
        }
    }

    /// One exchange with a buffered request body, its response collected whole (the token endpoint's).
    func execute(_ head: HTTPRequestHead, body: ByteBuffer?, limit: Int) async throws -> HTTP1Response {
        try await execute(HTTP1Exchange(head: head, body: body, upload: nil, limit: limit,
                                        requestIsHead: head.method == .HEAD, makeRelay: nil))
    }

    /// A reload replaced this pool: idle connections close, later requests fail at once, and
    /// each exchange in flight keeps its connection until it ends on its own terms.
    func retire() {
        isShutDown.store(true, ordering: .relaxed)
        for share in shares {
            onLoop(share) { [self] in perform(share.machine.retire(), on: share) }
        }
    }

    /// Closes every connection and fails waiting requests; later requests fail at once.
    func shutdown() {
        isShutDown.store(true, ordering: .relaxed)
        for share in shares {
            onLoop(share) { [self] in perform(share.machine.shutdown(), on: share) }
        }
    }

    // MARK: One loop's share

    /// The exchange on `share`'s loop (the caller runs there).
    nonisolated(nonsending) private func execute(_ exchange: HTTP1Exchange, on share: Share) async throws -> HTTP1Response {
        // Waiting for a connection counts as connecting, and stops at the exchange's deadline.
        let wait = Wait(connectTimeout: configuration.connectTimeout, deadline: exchange.deadline)
        let connection: HTTP1Connection
        if let pooled = try await lease(wait, on: share) {
            connection = pooled
        } else {
            connection = try await connect(wait, on: share)
        }
        let response: HTTP1Response
        do {
            response = try await connection.execute(exchange)
        } catch let stale as StaleConnection {
            guard stale.allowsResend(of: exchange), try await replace(connection, on: share) else {
                release(connection, reusable: false, on: share)
                throw stale.failure
            }
            configuration.onResend()
            return try await resend(exchange, on: share)
        } catch {
            release(connection, reusable: false, on: share)
            throw error
        }
        keep(connection, after: response, on: share)
        return response
    }

    /// The exchange once more after a stale connection, on a new connection for the slot `replace`
    /// handed over; the connect and the exchange keep the exchange's deadline.
    nonisolated(nonsending) private func resend(_ exchange: HTTP1Exchange, on share: Share) async throws -> HTTP1Response {
        let connection = try await connect(Wait(connectTimeout: configuration.connectTimeout, deadline: exchange.deadline),
                                           on: share)
        do {
            let response = try await connection.execute(exchange)
            keep(connection, after: response, on: share)
            return response
        } catch {
            release(connection, reusable: false, on: share)
            // A new connection is never stale (it carried nothing before); as it is, not again.
            throw (error as? StaleConnection)?.failure ?? error
        }
    }

    /// Closes a stale `connection` and hands its slot to a new one; `false`: shut down meanwhile.
    nonisolated(nonsending) private func replace(_ connection: HTTP1Connection, on share: Share) async throws -> Bool {
        let replaced = share.loop.inEventLoop ? share.machine.replace(connection)
            : try await share.loop.submit { share.machine.replace(connection) }.get()
        connection.close()
        return replaced
    }

    /// Gives `connection` back when its response is done with it: at once for a body collected
    /// whole, at a streamed body's end, never after a protocol switch (it leaves the pool, open).
    private func keep(_ connection: HTTP1Connection, after response: HTTP1Response, on share: Share) {
        if response.tunnel != nil {
            onLoop(share) { [self] in perform(share.machine.detach(connection, now: .now()), on: share) }
        } else if let finished = response.finished {
            // Completed on the connection's loop: the share's.
            finished.whenComplete { [self] result in
                release(connection, reusable: (try? result.get()) ?? false, on: share)
            }
        } else {
            release(connection, reusable: response.reusable, on: share)
        }
    }

    /// An idle connection of the share's, or `nil` when a slot was taken for the caller to open
    /// one. Without either, waits up to `wait.limit` for one.
    nonisolated(nonsending) private func lease(_ wait: Wait, on share: Share) async throws -> HTTP1Connection? {
        // The caller runs on the share's loop (`execute`); anything else is a bug, not a race.
        share.loop.preconditionInEventLoop()
        let (lease, action) = share.machine.lease(now: .now())
        perform(action, on: share)
        switch lease {
        case .use(let connection): return connection
        case .connect: return nil
        case .shutDown: throw Machine.shutDownError
        case .wait: return try await waitInLine(wait, on: share)
        }
    }

    /// Waits in the share's queue for a connection or a slot.
    nonisolated(nonsending) private func waitInLine(_ wait: Wait, on share: Share) async throws -> HTTP1Connection? {
        let id = share.machine.makeWaiterID()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<HTTP1Connection?, any Error>) in
                if Task.isCancelled {
                    continuation.resume(throwing: CancellationError())
                    return
                }
                // Still on the share's loop, in the same turn as `lease`.
                let action = share.machine.enqueue(continuation, id: id, deadline: wait.limit, failure: wait.failure,
                                                   now: .now())
                perform(action, on: share)
                if share.machine.waiterCount > 0 && share.recheck == nil { startRechecking(share) }
            }
        } onCancel: { [self] in
            onLoop(share) {
                share.machine.cancelWaiter(id)?.resume(throwing: CancellationError())
            }
        }
    }

    /// How often a loop whose requests wait at the cap tries it again (only while some wait).
    static let recheckInterval = TimeAmount.milliseconds(50)

    /// Tries the cap again now and then while requests wait on `share` (its loop): a liveness
    /// backstop behind the announcements between loops, never running below the cap.
    private func startRechecking(_ share: Share) {
        share.recheck = share.loop.scheduleRepeatedTask(initialDelay: Self.recheckInterval,
                                                        delay: Self.recheckInterval) { [self] task in
            guard share.machine.waiterCount > 0 else {
                task.cancel()
                share.recheck = nil
                return
            }
            perform(share.machine.slotMayBeFree(now: .now()), on: share)
        }
    }

    /// A new connection on the share's loop, for the slot the caller holds.
    nonisolated(nonsending) private func connect(_ wait: Wait, on share: Share) async throws -> HTTP1Connection {
        let connection: HTTP1Connection
        do {
            connection = try await HTTP1Connection.connect(to: configuration.endpoint, on: share.loop,
                                                           timeout: wait.limit - .now(), failure: wait.failure)
        } catch {
            onLoop(share) { [self] in perform(share.machine.connectFailed(now: .now()), on: share) }
            throw error
        }
        // The task resumes on the share's loop (its executor is the loop's); `onLoop` in case not.
        if share.loop.inEventLoop {
            if share.machine.connected(connection) { return connection }
        } else {
            let kept = try await share.loop.submit { share.machine.connected(connection) }.get()
            if kept { return connection }
        }
        connection.close()
        throw Machine.shutDownError
    }

    private func release(_ connection: HTTP1Connection, reusable: Bool, on share: Share) {
        onLoop(share) { [self] in
            perform(share.machine.release(connection, reusable: reusable, now: .now()), on: share)
        }
    }

    /// Runs `body` on the share's loop: at once when already there (the common case).
    private func onLoop(_ share: Share, _ body: @escaping @Sendable () -> Void) {
        if share.loop.inEventLoop {
            body()
        } else {
            share.loop.execute(body)
        }
    }

    // MARK: Actions

    /// Keeps, cancels or (re)schedules one of the share's timers; when it fires, the machine's
    /// `fired` transition runs and its action is performed.
    private func apply(_ timer: Machine.Timer, to slot: any ReferenceWritableKeyPath<Share, Scheduled<Void>?> & Sendable,
                       on share: Share,
                       fired: @escaping @Sendable (inout Machine, NIODeadline) -> Machine.Action) {
        switch timer {
        case .keep: break
        case .cancel:
            share[keyPath: slot]?.cancel()
            share[keyPath: slot] = nil
        case .schedule(let deadline):
            share[keyPath: slot]?.cancel()
            share[keyPath: slot] = share.loop.scheduleTask(deadline: deadline) { [self] in
                share[keyPath: slot] = nil
                perform(fired(&share.machine, .now()), on: share)
            }
        }
    }

    /// Does what the share's machine said. On the share's loop. Timers and waiters first:
    /// closing a channel on its loop runs its handlers at once, and a streamed response's end
    /// may come back here (`release`) before this returns.
    private func perform(_ action: Machine.Action, on share: Share) {
        apply(action.sweep, to: \.sweep, on: share) { $0.sweepFired(now: $1) }
        apply(action.waiterTimer, to: \.waiterTimer, on: share) { $0.waiterTimerFired(now: $1) }
        for handover in action.handovers {
            switch handover {
            case .use(let waiter, let connection): waiter.resume(returning: connection)
            case .connect(let waiter): waiter.resume(returning: nil)
            case .fail(let waiter, let error): waiter.resume(throwing: error)
            }
        }
        for connection in action.close { connection.close() }
        if action.slotFreed { announceFreeSlot(from: share) }
        if action.askForIdle { askForIdle(from: share.index, asking: share.index + 1) }
    }

    /// A slot was given back on `share`'s loop: every other loop with requests waiting hears
    /// of it. Only at the cap is any signal up; below it this reads a few unwritten words.
    private func announceFreeSlot(from share: Share) {
        for (index, signal) in signals.enumerated() where index != share.index && signal.isWaiting {
            let other = shares[index]
            other.loop.execute { [self] in
                perform(other.machine.slotMayBeFree(now: .now()), on: other)
            }
        }
    }

    /// Asks the loops after `origin`, one at a time, to close one idle connection so that its
    /// slot goes to a waiter on `origin` (announced by `announceFreeSlot`).
    private func askForIdle(from origin: Int, asking next: Int) {
        let index = next % shares.count
        guard index != origin else { return }
        let other = shares[index]
        other.loop.execute { [self] in
            let (closed, action) = other.machine.closeIdleForOtherLoop()
            perform(action, on: other)
            if !closed { askForIdle(from: origin, asking: index + 1) }
        }
    }
}

extension HTTP1Connection: PoolableConnection {
    var id: ObjectIdentifier { ObjectIdentifier(channel) }
}
