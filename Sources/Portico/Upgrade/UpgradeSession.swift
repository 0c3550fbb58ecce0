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
/// relayed to its end first.
///
/// When what happens is `UpgradeSessionStateMachine`'s, on the gateway's clock: this class turns
/// libmicrohttpd's calls, the relays' and the channels' events into the machine's, and its
/// actions into the channels' operations and one timer.
///
/// `@unchecked Sendable`: libmicrohttpd calls it from its daemon thread and `stop` from any
/// thread, but every method hops onto `loop` before touching state, and all state is read and
/// written there only (the relays call `activity` and `sideClosed` from their channels, on `loop`).
final class UpgradeSession: ConnectionUpgradeHandler, @unchecked Sendable {
    typealias Machine = UpgradeSessionStateMachine<any UpgradeClientSide>

    private let tunnel: UpstreamTunnel
    private let loop: any EventLoop
    private let clock: any GatewayClock
    private let onEnd: @Sendable (UpgradeSummary) -> Void
    private let client = RelayHandler(side: .client)
    private var machine: Machine
    /// The timer the machine asked for: the idle check, then the limit on finishing frames.
    private var timer: SessionTimer?

    init(tunnel: UpstreamTunnel, idleTimeout: Duration, clock: any GatewayClock,
         onEnd: @escaping @Sendable (UpgradeSummary) -> Void) {
        self.tunnel = tunnel
        self.loop = tunnel.eventLoop
        self.clock = clock
        self.onEnd = onEnd
        machine = Machine(idleTimeout: idleTimeout)
        tunnel.channel.closeFuture.whenComplete { [self] _ in
            loop.execute { self.perform(self.machine.sideGone(.upstream, now: self.clock.now)) }
        }
    }

    // MARK: ConnectionUpgradeHandler (any thread)

    func upgraded(_ connection: UpgradedConnection) {
        arrived(connection)
    }

    func serverStopping() {
        loop.execute { self.perform(self.machine.serverStopping(now: self.clock.now)) }
    }

    func abandoned() {
        loop.execute { self.perform(self.machine.abandoned(now: self.clock.now)) }
    }

    /// The client's side is here (`upgraded`, or a test's channel).
    func arrived(_ connection: any UpgradeClientSide) {
        loop.execute { self.perform(self.machine.clientArrived(connection, now: self.clock.now)) }
    }

    // MARK: From the relays (on the loop)

    /// Bytes moved one way or the other.
    func activity() {
        machine.activity(now: clock.now)
    }

    func sideClosed(_ side: RelayHandler.Side) {
        perform(machine.sideClosed(side, now: clock.now))
    }

    // MARK: The machine's actions (on the loop)

    private func perform(_ action: Machine.Action) {
        action.giveBack?.giveBack()
        if let connection = action.attach { attach(connection) }
        if let connection = action.join { joinSides(received: connection.received) }
        switch action.timer {
        case .keep:
            break
        case .idleCheck(let due):
            schedule(at: due) { $0.machine.idleCheckDue(now: $0.clock.now) }
        case .finish(let limit):
            schedule(at: limit) { $0.machine.finishTimedOut() }
        case .stop:
            timer?.cancel()
            timer = nil
        }
        if action.abandonUpstream { tunnel.abandon() }
        switch action.close {
        case nil:
            break
        case .finishFrames:
            // Either may settle at once (between two frames already), inside its call.
            let upstream = tunnel.relay.value
            client.finishFrame { [self] in perform(machine.sideSettled()) }
            upstream.finishFrame { [self] in perform(machine.sideSettled()) }
        case .now(let goingAway):
            closeNow(goingAway: goingAway)
        }
        if let report = action.report { self.report(report.reason, duration: report.duration) }
    }

    private func attach(_ connection: any UpgradeClientSide) {
        connection.attach(NIOLoopBound(client, eventLoop: loop), on: loop).hop(to: loop).assumeIsolated().whenComplete { [self] result in
            switch result {
            case .success(let channel):
                channel.closeFuture.whenComplete { [self] _ in
                    connection.channelClosed()
                    loop.execute { self.perform(self.machine.sideGone(.client, now: self.clock.now)) }
                }
                perform(machine.clientAttached(now: clock.now))
            case .failure:
                perform(machine.clientAttachFailed(now: clock.now))
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
    }

    /// Closes both sides after what is on its way; with `goingAway`, a close frame 1001 first to
    /// each whose stream is between two frames.
    private func closeNow(goingAway: Bool) {
        let upstream = tunnel.relay.value
        client.close(after: goingAway && upstream.frames.atBoundary
                     ? WebSocketCloseFrame.toClient(code: WebSocketCloseFrame.goingAway) : nil)
        upstream.close(after: goingAway && client.frames.atBoundary
                       ? WebSocketCloseFrame.toUpstream(code: WebSocketCloseFrame.goingAway) : nil)
    }

    private func report(_ reason: UpgradeEndReason, duration: Duration) {
        let summary = UpgradeSummary(bytesFromClient: client.bytesRead, bytesFromUpstream: tunnel.relay.value.bytesRead,
                                     duration: duration, reason: reason)
        tunnel.ended(summary)
        onEnd(summary)
    }

    /// Fires `event` on the loop at `instant` of the gateway's clock, replacing the timer before.
    private func schedule(at instant: ContinuousClock.Instant, _ event: @escaping @Sendable (UpgradeSession) -> Machine.Action) {
        timer?.cancel()
        timer = SessionTimer(at: instant, clock: clock, on: loop) { [self] in perform(event(self)) }
    }
}

/// A timer on the gateway's clock that fires on an event loop: one of the loop's own when NIO's
/// timers keep the clock's time (the real one), else a task sleeping on the clock (a test's).
/// A task's firing may come after its `cancel`; the machine's events are safe to come late.
enum SessionTimer {
    case loop(Scheduled<Void>)
    case task(Task<Void, Never>)

    init(at instant: ContinuousClock.Instant, clock: any GatewayClock, on loop: any EventLoop,
         _ fire: @escaping @Sendable () -> Void) {
        if let deadline = clock.eventLoopDeadline(for: instant) {
            self = .loop(loop.scheduleTask(deadline: deadline, fire))
        } else {
            self = .task(Task {
                do { try await clock.sleep(until: instant) } catch { return }
                loop.execute(fire)
            })
        }
    }

    func cancel() {
        switch self {
        case .loop(let scheduled): scheduled.cancel()
        case .task(let task): task.cancel()
        }
    }
}

/// The client's side of a session as the session needs it: libmicrohttpd's upgraded connection
/// in the gateway, a channel of their own in tests.
protocol UpgradeClientSide: AnyObject, Sendable {
    /// Bytes read past the handshake: they go to the upstream first.
    var received: [UInt8] { get }
    /// The connection as a channel on `loop`, with `relay` in its pipeline.
    func attach(_ relay: NIOLoopBound<RelayHandler>, on loop: any EventLoop) -> EventLoopFuture<any Channel>
    /// Its channel closed, and its descriptor with it: it goes back to its server.
    func channelClosed()
    /// It never became a channel (or the session was over first): its descriptor is closed and
    /// it goes back to its server.
    func giveBack()
}

extension UpgradedConnection: UpgradeClientSide {
    func attach(_ relay: NIOLoopBound<RelayHandler>, on loop: any EventLoop) -> EventLoopFuture<any Channel> {
        // The channel is registered on `loop`: its initializer runs there.
        ClientBootstrap(group: loop).channelInitializer { channel in
            channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(relay.value) }
        }.withConnectedSocket(socket)
    }

    func channelClosed() {
        // The handler's descriptor is closed with the channel: libmicrohttpd may close its own now.
        close()
    }

    func giveBack() {
        Glibc.close(socket)
        close()
    }
}
