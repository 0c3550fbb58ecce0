import MicroHTTPD
import NIOCore
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// One upgraded session: the client's connection, handed over by libmicrohttpd once the 101 is
/// sent (`UpgradedConnection`), glued to the upstream's (`UpstreamTunnel`) on the upstream
/// connection's event loop — the loop of the request's daemon thread pair, so the session never
/// leaves the pair it arrived on. Either side closing or resetting closes the other at once
/// (after what was already relayed is written); a session quiet both ways for `idleTimeout`
/// is ended, as is every session when the server stops past its grace, each side then getting
/// a close frame 1001 first, between two frames (`WebSocketFrameTracker`): a frame in progress is
/// relayed to its end first (`closeSides`).
///
/// `@unchecked Sendable`: libmicrohttpd calls it from its daemon thread and `stop` from any
/// thread, but every method hops onto `loop` before touching state, and all state is read and
/// written there only.
final class UpgradeSession: ConnectionUpgradeHandler, @unchecked Sendable {
    private let tunnel: UpstreamTunnel
    private let loop: any EventLoop
    private let idleTimeout: TimeAmount
    private let onEnd: @Sendable (UpgradeSummary) -> Void
    private let client = RelayHandler(side: .client)
    private var connection: UpgradedConnection?
    private var started: ContinuousClock.Instant?
    private var lastActivity = NIODeadline.now()
    private var idleTimer: Scheduled<Void>?
    /// Ending with close frames: the limit on waiting for frames in progress (`closeSides`).
    private var finishTimer: Scheduled<Void>?
    private var closing = false
    private var reason: UpgradeEndReason?
    /// Sides still open (the client's counts from its channel's registration).
    private var openSides = 1
    private var reported = false

    init(tunnel: UpstreamTunnel, idleTimeout: Duration, onEnd: @escaping @Sendable (UpgradeSummary) -> Void) {
        self.tunnel = tunnel
        self.loop = tunnel.eventLoop
        self.idleTimeout = TimeAmount(idleTimeout)
        self.onEnd = onEnd
        tunnel.channel.closeFuture.whenComplete { [self] _ in loop.execute { self.sideGone(.upstream) } }
    }

    // MARK: ConnectionUpgradeHandler (any thread)

    func upgraded(_ connection: UpgradedConnection) {
        loop.execute { self.start(connection) }
    }

    func serverStopping() {
        loop.execute { self.end(.drained, goingAway: true) }
    }

    func abandoned() {
        loop.execute {
            self.reason = self.reason ?? .clientClosed
            self.tunnel.abandon()
        }
    }

    // MARK: On the loop

    private func start(_ connection: UpgradedConnection) {
        started = .now
        lastActivity = .now()
        guard reason == nil else {
            // Ended before the client's side came (the upstream closed, the server stopping):
            // give it back at once.
            Glibc.close(connection.socket)
            connection.close()
            return
        }
        self.connection = connection
        let client = NIOLoopBound(self.client, eventLoop: loop)
        openSides += 1
        // The channel is registered on `loop`: its initializer runs there.
        let bootstrap = ClientBootstrap(group: loop).channelInitializer { channel in
            channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(client.value) }
        }
        bootstrap.withConnectedSocket(connection.socket).hop(to: loop).assumeIsolated().whenComplete { [self] result in
            switch result {
            case .success(let channel):
                channel.closeFuture.whenComplete { [self] _ in
                    // The handler's descriptor is closed with the channel: libmicrohttpd may close its own now.
                    connection.close()
                    loop.execute { self.sideGone(.client) }
                }
                joinSides(received: connection.received)
            case .failure:
                Glibc.close(connection.socket)
                connection.close()
                end(.clientClosed, goingAway: false)
                sideGone(.client)
            }
        }
    }

    private func joinSides(received: [UInt8]) {
        let upstream = tunnel.relay.value
        if !received.isEmpty, let channel = upstream.channel {
            // Bytes the client sent past its handshake, read by libmicrohttpd: they go first.
            var buffer = channel.allocator.buffer(capacity: received.count)
            buffer.writeBytes(received)
            channel.write(buffer, promise: nil)
        }
        client.join(upstream, session: self)
        upstream.join(client, session: self)
        if reason != nil {
            closeSides(goingAway: reason == .drained || reason == .idleTimeout)
            return
        }
        scheduleIdleCheck(at: lastActivity + idleTimeout)
    }

    /// Bytes moved one way or the other.
    func activity() {
        lastActivity = .now()
    }

    func sideClosed(_ side: RelayHandler.Side) {
        end(side == .client ? .clientClosed : .upstreamClosed, goingAway: false)
    }

    private func scheduleIdleCheck(at deadline: NIODeadline) {
        idleTimer = loop.scheduleTask(deadline: deadline) { [self] in
            guard reason == nil else { return }
            let due = lastActivity + idleTimeout
            if NIODeadline.now() >= due {
                end(.idleTimeout, goingAway: true)
            } else {
                scheduleIdleCheck(at: due)
            }
        }
    }

    /// Ends the session, once: both sides are closed after what is already on its way, with a
    /// close frame 1001 first when `goingAway` and the stream toward that side is between frames.
    private func end(_ why: UpgradeEndReason, goingAway: Bool) {
        guard reason == nil else { return }
        reason = why
        idleTimer?.cancel()
        idleTimer = nil
        guard connection != nil, client.channel != nil else {
            // Not joined yet: the upstream goes now; the client's side when it comes (`start`).
            if connection == nil { tunnel.abandon() }
            return
        }
        closeSides(goingAway: goingAway)
    }

    /// How long a side in the middle of a frame gets to finish it before the close frames.
    static let finishTimeout = TimeAmount.seconds(10)

    /// Closes both sides; with `goingAway`, each first gets its close frame 1001, which must go in
    /// between two frames: a side that is in the middle of sending one relays it to its end first
    /// (and nothing after it), for at most `finishTimeout`; a side still mid-frame then is closed
    /// without one.
    private func closeSides(goingAway: Bool) {
        guard goingAway else {
            closeNow(goingAway: false)
            return
        }
        let upstream = tunnel.relay.value
        var unsettled = 2
        let settled = { [self] in
            unsettled -= 1
            if unsettled == 0 { closeNow(goingAway: true) }
        }
        finishTimer = loop.scheduleTask(in: Self.finishTimeout) { [self] in closeNow(goingAway: true) }
        client.finishFrame(then: settled)
        upstream.finishFrame(then: settled)
    }

    private func closeNow(goingAway: Bool) {
        guard !closing else { return }
        closing = true
        finishTimer?.cancel()
        finishTimer = nil
        let upstream = tunnel.relay.value
        client.close(after: goingAway && upstream.frames.atBoundary
                     ? WebSocketCloseFrame.toClient(code: WebSocketCloseFrame.goingAway) : nil)
        upstream.close(after: goingAway && client.frames.atBoundary
                       ? WebSocketCloseFrame.toUpstream(code: WebSocketCloseFrame.goingAway) : nil)
    }

    /// A side's channel closed; when both have, the session is reported.
    private func sideGone(_ side: RelayHandler.Side) {
        openSides -= 1
        // The other side follows (`end` closes it).
        if reason == nil { end(side == .client ? .clientClosed : .upstreamClosed, goingAway: false) }
        guard openSides == 0, !reported else { return }
        reported = true
        // The upgraded connection holds this session as its handler: the session lets it go.
        connection = nil
        let summary = UpgradeSummary(bytesFromClient: client.bytesRead, bytesFromUpstream: tunnel.relay.value.bytesRead,
                                     duration: started.map { $0.duration(to: .now) } ?? .zero,
                                     reason: reason ?? .upstreamClosed)
        tunnel.ended(summary)
        onEnd(summary)
    }
}
