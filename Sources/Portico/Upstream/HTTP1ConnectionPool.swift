import NIOCore
import NIOHTTP1
import Synchronization

/// A small HTTP/1.1 connection pool on SwiftNIO: the `nio` transport's, upstreams' and token
/// endpoints' alike. Portico owns it rather than using AsyncHTTPClient's for two
/// reasons: cost (a task's exchange stays on its event loop: an idle connection of the caller's
/// loop is leased first and new ones open there; measured 25 % less CPU per proxied request),
/// and verification — with `tls.server_name`, the certificate must name `server_name` by DNS
/// name (`ServerNameCheck`), and AsyncHTTPClient builds its `NIOSSLClientHandler` itself, whose
/// host name check also accepts an IP-address name equal to the connected address.
///
/// At most `maxConnections` connections exist at once (idle ones included); a request that
/// finds none free waits up to `connectTimeout` for one (then `UpstreamError.connectTimeout`).
/// Connections are kept alive unless either side says otherwise, reused last-in first-out, and
/// closed between one and two `idleTimeout`s after their last use (one sweep timer per pool),
/// or at `shutdown`.
final class HTTP1ConnectionPool: Sendable {
    struct Configuration: Sendable {
        var endpoint: HTTP1Connection.Endpoint
        var maxConnections: Int
        var connectTimeout: Duration
        var idleTimeout: Duration
    }

    private struct IdleConnection {
        var connection: HTTP1Connection
        /// When it went idle: closed once idle for `idleTimeout` (by the next lease or the sweep).
        var since: NIODeadline
    }

    private struct Waiter {
        var id: Int
        var continuation: CheckedContinuation<HTTP1Connection?, any Error>
        var timeout: Scheduled<Void>?
    }

    private struct State {
        /// Slots taken by requests connecting or exchanging; `leased + idle.count <= maxConnections`.
        var leased = 0
        var idle: [IdleConnection] = []
        var waiters: [Waiter] = []
        var nextWaiterID = 0
        /// Every open connection, to close at shutdown.
        var open: [ObjectIdentifier: HTTP1Connection] = [:]
        var isShutDown = false
        /// The one timer that closes connections idle too long, while any are idle.
        var sweep: Scheduled<Void>?
    }

    private let configuration: Configuration

    /// How long a request may wait for a connection (a free slot, then connecting), and what
    /// it fails with past that: `connect_timeout`, or the exchange's own deadline if sooner.
    private struct Wait {
        var limit: NIODeadline
        var failure: UpstreamError
    }
    private let group: any EventLoopGroup
    private let state = Mutex(State())

    init(_ configuration: Configuration, group: any EventLoopGroup) {
        self.configuration = configuration
        self.group = group
    }

    /// One exchange on a pooled (or new) connection. Errors are `UpstreamError` where a kind
    /// applies; cancellation closes the connection in use and rethrows. A response whose body
    /// streams keeps its connection until the body has ended (or failed).
    nonisolated(nonsending) func execute(_ exchange: HTTP1Exchange) async throws -> HTTP1Response {
        // Waiting for a connection counts as connecting, and stops at the exchange's deadline.
        var wait = Wait(limit: .now() + TimeAmount(configuration.connectTimeout), failure: .connectTimeout)
        if let deadline = exchange.deadline, deadline < wait.limit { wait = Wait(limit: deadline, failure: .timeout) }
        let connection: HTTP1Connection
        if let pooled = try await lease(wait) {
            connection = pooled
        } else {
            do {
                connection = try await connect(wait)
            } catch {
                release(nil)
                throw error
            }
        }
        do {
            let response = try await connection.execute(exchange)
            if let finished = response.finished {
                finished.whenComplete { [self] result in
                    release(connection, reusable: (try? result.get()) ?? false)
                }
            } else {
                release(connection, reusable: response.reusable)
            }
            return response
        } catch {
            release(connection, reusable: false)
            throw error
        }
    }

    /// One exchange with a buffered request body, its response collected whole (the token endpoint's).
    func execute(_ head: HTTPRequestHead, body: ByteBuffer?, limit: Int) async throws -> HTTP1Response {
        try await execute(HTTP1Exchange(head: head, body: body, upload: nil, limit: limit,
                                        requestIsHead: head.method == .HEAD, makeRelay: nil))
    }

    /// Closes every connection and fails waiting requests; later requests fail at once.
    func shutdown() {
        let (connections, waiters) = state.withLock { state in
            state.isShutDown = true
            let all = Array(state.open.values)
            let waiters = state.waiters
            state.sweep?.cancel()
            state.sweep = nil
            state.idle = []
            state.waiters = []
            state.open = [:]
            return (all, waiters)
        }
        for waiter in waiters {
            waiter.timeout?.cancel()
            waiter.continuation.resume(throwing: UpstreamError.connectFailed("client is shut down"))
        }
        connections.forEach { $0.close() }
    }

    // MARK: Leasing

    /// Takes a slot: with an open idle connection (the most recently used one on the caller's
    /// event loop, else the most recently used one), or `nil` when the caller may open a new one.
    /// Without a free slot, waits up to `connectTimeout` for one.
    nonisolated(nonsending) private func lease(_ wait: Wait) async throws -> HTTP1Connection? {
        enum Outcome { case pooled(HTTP1Connection), connect, wait, shutDown }
        var stale: [HTTP1Connection] = []
        let now = NIODeadline.now()
        let idleTimeout = TimeAmount(configuration.idleTimeout)
        let outcome = state.withLock { state -> Outcome in
            if state.isShutDown { return .shutDown }
            while let index = state.idle.lastIndex(where: { $0.connection.channel.eventLoop.inEventLoop })
                    ?? state.idle.indices.last {
                let candidate = state.idle.remove(at: index)
                if candidate.connection.isActive && candidate.since + idleTimeout > now {
                    state.leased += 1
                    return .pooled(candidate.connection)
                }
                state.open[ObjectIdentifier(candidate.connection.channel)] = nil
                stale.append(candidate.connection)
            }
            guard state.leased < configuration.maxConnections else { return .wait }
            state.leased += 1
            return .connect
        }
        stale.forEach { $0.close() }
        switch outcome {
        case .pooled(let connection): return connection
        case .connect: return nil
        case .shutDown: throw UpstreamError.connectFailed("client is shut down")
        case .wait: return try await waitForSlot(wait)
        }
    }

    /// Waits for the slot a finishing request hands over (with its connection when reusable).
    private func waitForSlot(_ wait: Wait) async throws -> HTTP1Connection? {
        let id = state.withLock { state in
            defer { state.nextWaiterID += 1 }
            return state.nextWaiterID
        }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<HTTP1Connection?, any Error>) in
                // Like AsyncHTTPClient: waiting for a pooled connection counts as connecting.
                let timeout = group.any().scheduleTask(deadline: wait.limit) { [self] in
                    resumeWaiter(id, throwing: wait.failure)
                }
                let immediate: (any Error)? = state.withLock { state in
                    if state.isShutDown { return UpstreamError.connectFailed("client is shut down") }
                    if Task.isCancelled { return CancellationError() }
                    state.waiters.append(Waiter(id: id, continuation: continuation, timeout: timeout))
                    return nil
                }
                if let immediate {
                    timeout.cancel()
                    continuation.resume(throwing: immediate)
                }
            }
        } onCancel: {
            resumeWaiter(id, throwing: CancellationError())
        }
    }

    private func resumeWaiter(_ id: Int, throwing error: any Error) {
        let waiter = state.withLock { state -> Waiter? in
            guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return state.waiters.remove(at: index)
        }
        waiter?.timeout?.cancel()
        waiter?.continuation.resume(throwing: error)
    }

    /// Gives a slot back. A reusable open connection goes to the first waiter, else to the idle
    /// list; anything else is closed, and a waiter gets the slot to open a connection of its own.
    private func release(_ connection: HTTP1Connection?, reusable: Bool = false) {
        let keep = connection.flatMap { reusable && $0.isActive ? $0 : nil }
        let (waiter, close) = state.withLock { state -> (Waiter?, Bool) in
            if let connection, keep == nil || state.isShutDown {
                state.open[ObjectIdentifier(connection.channel)] = nil
            }
            if state.isShutDown { return (nil, connection != nil) }
            if !state.waiters.isEmpty {
                return (state.waiters.removeFirst(), keep == nil && connection != nil)  // `leased` stays: the slot passes on
            }
            state.leased -= 1
            if let keep {
                state.idle.append(IdleConnection(connection: keep, since: .now()))
                if state.sweep == nil { state.sweep = scheduleSweep(on: keep.channel.eventLoop) }
                return (nil, false)
            }
            return (nil, connection != nil)
        }
        if close { connection?.close() }
        waiter?.timeout?.cancel()
        waiter?.continuation.resume(returning: keep)
    }

    /// A new connection, registered for shutdown. Needs a slot.
    private func connect(_ wait: Wait) async throws -> HTTP1Connection {
        let connection = try await HTTP1Connection.connect(to: configuration.endpoint, on: group,
                                                           timeout: wait.limit - .now(), failure: wait.failure)
        let shutDown = state.withLock { state in
            if !state.isShutDown { state.open[ObjectIdentifier(connection.channel)] = connection }
            return state.isShutDown
        }
        if shutDown {
            connection.close()
            throw UpstreamError.connectFailed("client is shut down")
        }
        return connection
    }

    /// The sweep, `idleTimeout` from now: a connection is closed between one and two idle
    /// timeouts after its last use, for one timer per pool instead of one per request.
    private func scheduleSweep(on eventLoop: any EventLoop) -> Scheduled<Void> {
        eventLoop.scheduleTask(in: TimeAmount(configuration.idleTimeout)) { [self] in sweepIdle() }
    }

    private func sweepIdle() {
        let cutoff = NIODeadline.now() - TimeAmount(configuration.idleTimeout)
        let expired = state.withLock { state -> [HTTP1Connection] in
            state.sweep = nil
            guard !state.isShutDown else { return [] }
            var expired: [HTTP1Connection] = []
            state.idle.removeAll { idle in
                guard idle.since <= cutoff || !idle.connection.isActive else { return false }
                state.open[ObjectIdentifier(idle.connection.channel)] = nil
                expired.append(idle.connection)
                return true
            }
            if let last = state.idle.last { state.sweep = scheduleSweep(on: last.connection.channel.eventLoop) }
            return expired
        }
        expired.forEach { $0.close() }
    }
}
