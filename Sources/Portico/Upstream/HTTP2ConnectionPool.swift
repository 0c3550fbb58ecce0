import LockAudit
import NIOCore
import Synchronization

/// HTTP/2 connections to one endpoint (`protocol: http2 | auto` on the `nio` transport), kept
/// like `HTTP1ConnectionPool`'s: **one share per event loop**, touched only on its loop, so a
/// request takes and gives back a stream without a lock and writes nothing another core reads.
/// Each share multiplexes requests over a few connections (`HTTP2PoolStateMachine` decides
/// which, and when another opens); the connections' count is the upstream's `max_connections`,
/// shared with the other loops through one `SharedCap` written per connection, never per request.
///
/// A request is a stream (`HTTP2Connection.execute`); its end (whatever ended it) gives its
/// room back. A stream the upstream refused before its application
/// saw it (`HTTP2StreamRefused`: REFUSED_STREAM, above a GOAWAY's last stream id) goes out once
/// more on another connection (or a new one), safe for any method; `onRefusedRetry` counts it.
///
/// When `max_connections` is below what the loops would open (`connections_per_loop` each),
/// only the first shares hold connections, each an equal part of the cap, and a request on
/// another loop goes to one of them. Otherwise a loop could be left with no connection and no
/// room to open one while another loop's multiplexed connection sat idle (the HTTP/1.1 pool asks
/// another loop to close an idle connection instead; an HTTP/2 connection is rarely idle).
final class HTTP2ConnectionPool: Sendable {
    struct Configuration: Sendable {
        var endpoint: HTTP1Connection.Endpoint
        var http2: HTTP2Config
        var maxConnections: Int
        var connectTimeout: Duration
        var capName: String
        var onRefusedRetry: @Sendable () -> Void = {}
        /// Connections opened and closed (for the open-connections gauge).
        var onConnection: @Sendable (_ opened: Bool) -> Void = { _ in }
    }

    typealias Waiter = CheckedContinuation<Lease, any Error>
    typealias Machine = HTTP2PoolStateMachine<HTTP2Connection, Waiter>

    /// What a waiting request is handed.
    enum Lease: Sendable {
        case use(HTTP2Connection, Machine.EntryID)
        case connect(Machine.EntryID)
    }

    /// One loop's share; its mutable parts are touched only on `loop` (every entry point checks
    /// or hops, and every callback — a connection's events and close, a stream's close, a
    /// waiter's timer — is scheduled on `loop`, where the share's connections live). Hence
    /// `@unchecked Sendable` without a lock, as `HTTP1ConnectionPool.Share`.
    private final class Share: @unchecked Sendable {
        let loop: any EventLoop
        var machine: Machine

        init(loop: any EventLoop, machine: Machine) {
            self.loop = loop
            self.machine = machine
        }
    }

    private let configuration: Configuration
    private let loops: EventLoops
    private let shares: [Share]
    /// Shares that may hold connections: `shares[0..<usable]`; loop `i` uses `i % usable`.
    private let usable: Int
    private let home: Int
    private let isShutDown = Atomic<Bool>(false)
    private let isTLS: Bool

    init(_ configuration: Configuration, loops: EventLoops) {
        self.configuration = configuration
        self.loops = loops
        isTLS = configuration.endpoint.tls != nil
        let cap = SharedCap(name: configuration.capName)
        let parts = Self.parts(loops: loops.loops.count, maxConnections: configuration.maxConnections,
                               connectionsPerLoop: configuration.http2.connectionsPerLoop)
        usable = parts.usable
        shares = loops.loops.map { loop in
            Share(loop: loop, machine: Machine(cap: cap, maxConnections: configuration.maxConnections,
                                               connectionsPerLoop: parts.perShare,
                                               maxStreams: configuration.http2.maxConcurrentStreams))
        }
        home = loops.nextHomeIndex() % parts.usable
    }

    /// How many shares hold connections and how many each may open, so that every one of them
    /// can always open its first: all loops with `connections_per_loop` each while the cap
    /// allows that, else `min(loops, max_connections)` shares with an equal part each.
    static func parts(loops: Int, maxConnections: Int, connectionsPerLoop: Int) -> (usable: Int, perShare: Int) {
        let loops = max(1, loops), cap = max(1, maxConnections), perLoop = max(1, connectionsPerLoop)
        guard loops * perLoop > cap else { return (loops, perLoop) }
        let usable = min(loops, cap)
        return (usable, max(1, min(perLoop, cap / usable)))
    }

    /// One exchange on a stream of a pooled (or new) connection. `HTTP2Unavailable` when ALPN did
    /// not choose h2 (the caller may fall back to HTTP/1.1); other errors as `HTTP1ConnectionPool`'s.
    nonisolated(nonsending) func execute(_ exchange: HTTP1Exchange) async throws -> HTTP1Response {
        if isShutDown.load(ordering: .relaxed) { throw Machine.shutDownError }
        if let index = loops.currentIndex, index < usable {
            return try await execute(exchange, on: shares[index])
        }
        return try await execute(exchange, hoppingTo: loops.currentIndex.map { $0 % usable } ?? home)
    }

    /// From a thread that is not a loop, or a loop whose share holds no connections.
    @concurrent private func execute(_ exchange: HTTP1Exchange, hoppingTo index: Int) async throws -> HTTP1Response {
        let share = shares[index]
        return try await withTaskExecutorPreference(loops.executors[index]) {
            try await self.execute(exchange, on: share)
        }
    }

    func retire() {
        isShutDown.store(true, ordering: .relaxed)
        for share in shares {
            onLoop(share) { [self] in perform(share.machine.retire(), on: share) }
        }
    }

    func shutdown() {
        isShutDown.store(true, ordering: .relaxed)
        for share in shares {
            onLoop(share) { [self] in perform(share.machine.shutdown(), on: share) }
        }
    }

    /// Connections and streams open on every loop (for `/upstreams`; hops to each loop).
    func snapshot() async -> (connections: Int, streams: Int) {
        var connections = 0, streams = 0
        for share in shares {
            let counts = try? await share.loop.submit { (share.machine.connectionCount, share.machine.openStreams) }.get()
            connections += counts?.0 ?? 0
            streams += counts?.1 ?? 0
        }
        return (connections, streams)
    }

    // MARK: One loop's share

    nonisolated(nonsending) private func execute(_ exchange: HTTP1Exchange, on share: Share) async throws -> HTTP1Response {
        do {
            return try await attempt(exchange, avoiding: nil, on: share)
        } catch let refused as RefusedOn {
            // Never reached the upstream's application (or, lost with its connection, safe to send twice): once more, elsewhere.
            if Task.isCancelled { throw CancellationError() }
            guard refused.resendable || exchange.resendableAfterWrite else { throw refused.failure }
            configuration.onRefusedRetry()
            do {
                return try await attempt(exchange, avoiding: refused.entry, on: share)
            } catch let again as RefusedOn {
                throw again.failure
            }
        }
    }

    /// A stream refused (`resendable`: whatever its method) or lost with its connection before
    /// its response, with the connection it was on.
    private struct RefusedOn: Error {
        var failure: UpstreamError
        var resendable: Bool
        var entry: Machine.EntryID

        init?(_ error: any Error, entry: Machine.EntryID) {
            if let refused = HTTP2StreamRefused.from(error) {
                (failure, resendable) = (refused.failure, true)
            } else if let lost = error as? HTTP2ConnectionLost {
                (failure, resendable) = (lost.failure, false)
            } else {
                return nil
            }
            self.entry = entry
        }
    }

    nonisolated(nonsending) private func attempt(_ exchange: HTTP1Exchange, avoiding: Machine.EntryID?,
                                                on share: Share) async throws -> HTTP1Response {
        let wait = Wait(connectTimeout: configuration.connectTimeout, deadline: exchange.deadline)
        let lease = try await lease(wait, avoiding: avoiding, on: share)
        let connection: HTTP2Connection, entry: Machine.EntryID
        switch lease {
        case .use(let pooled, let id):
            (connection, entry) = (pooled, id)
        case .connect(let id):
            connection = try await connect(id, wait: wait, on: share)
            entry = id
        }
        do {
            // Whatever ends the stream (its end, a reset, a cancel, the connection's close) gives its room back.
            return try await connection.execute(exchange) { [self] in
                perform(share.machine.streamClosed(entry), on: share)
            }
        } catch {
            // A connection the upstream broke (a flood, a malformed frame): its error, never sent again.
            if let failure = connection.failure.recorded { throw failure }
            throw RefusedOn(error, entry: entry) ?? error
        }
    }

    private struct Wait {
        var limit: NIODeadline
        var failure: UpstreamError

        init(connectTimeout: Duration, deadline: NIODeadline?) {
            limit = .now() + TimeAmount(connectTimeout)
            failure = .connectTimeout
            if let deadline, deadline < limit { (limit, failure) = (deadline, .timeout) }
        }
    }

    /// A stream's room on a connection, or a slot to open one, waiting for either up to `wait.limit`.
    nonisolated(nonsending) private func lease(_ wait: Wait, avoiding: Machine.EntryID?, on share: Share) async throws -> Lease {
        share.loop.preconditionInEventLoop()
        switch share.machine.lease(avoiding: avoiding) {
        case .use(let connection, let id): return .use(connection, id)
        case .connect(let id): return .connect(id)
        case .shutDown: throw Machine.shutDownError
        case .wait: break
        }
        let id = share.machine.makeWaiterID()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: Waiter) in
                if Task.isCancelled {
                    continuation.resume(throwing: CancellationError())
                    return
                }
                perform(share.machine.enqueue(continuation, id: id), on: share)
                // Left to fire when the waiter is long served: it then finds nobody (cheaper than
                // keeping a handle per waiter to cancel).
                share.loop.scheduleTask(deadline: wait.limit) {
                    share.machine.cancelWaiter(id)?.resume(throwing: wait.failure)
                }
            }
        } onCancel: { [self] in
            onLoop(share) {
                share.machine.cancelWaiter(id)?.resume(throwing: CancellationError())
            }
        }
    }

    /// Opens the connection for `id` (a slot is taken for it) and tells the share.
    nonisolated(nonsending) private func connect(_ id: Machine.EntryID, wait: Wait, on share: Share) async throws -> HTTP2Connection {
        let remaining = wait.limit - .now()
        let events = HTTP2Connection.Events(
            settings: { [self] limit in
                perform(share.machine.settingsChanged(id, peerLimit: limit), on: share)
            },
            goAway: { [self] in perform(share.machine.goAway(id), on: share) })
        let connection: HTTP2Connection
        do {
            connection = try await HTTP2Connection.connect(to: configuration.endpoint, on: share.loop,
                                                           configuration: configuration.http2,
                                                           timeout: max(remaining, .milliseconds(1)), failure: wait.failure,
                                                           events: events)
        } catch {
            // Waiters hear the same (`HTTP2Unavailable` included: with `auto` they go out on HTTP/1.1).
            let failure: any Error = (error is UpstreamError || error is HTTP2Unavailable) ? error : UpstreamError.connectFailed("connection failed")
            onLoop(share) { [self] in perform(share.machine.connectFailed(id, error: failure), on: share) }
            throw error
        }
        configuration.onConnection(true)
        // Known to the share before its close can be: a close already done completes at once.
        onLoop(share) { [self] in
            perform(share.machine.connected(id, connection: connection, peerLimit: connection.initialMaxStreams), on: share)
            connection.channel.closeFuture.whenComplete { [self] _ in
                configuration.onConnection(false)
                perform(share.machine.closed(id), on: share)
            }
        }
        return connection
    }

    private func onLoop(_ share: Share, _ body: @escaping @Sendable () -> Void) {
        if share.loop.inEventLoop { body() } else { share.loop.execute(body) }
    }

    /// Does what the share's machine said. On the share's loop.
    private func perform(_ action: Machine.Action, on share: Share) {
        for handover in action.handovers {
            switch handover {
            case .use(let waiter, let connection, let id): waiter.resume(returning: .use(connection, id))
            case .connect(let waiter, let id): waiter.resume(returning: .connect(id))
            case .fail(let waiter, let error): waiter.resume(throwing: error)
            }
        }
        for connection in action.goAway { connection.goAway() }
        for connection in action.close { connection.close() }
    }
}
