/// The logic of one `UpgradeSession`, as a value: events in (the client's connection arriving
/// and joining, bytes moving, a side closing or gone, the server stopping, the timers), actions
/// out. No channels and no clock of its own: every event that needs the time is given `now`, on
/// the gateway's clock. Generic over the client's connection (libmicrohttpd's upgraded
/// connection; a name in tests), which it holds while the session needs it kept.
///
/// A session waits for the client's connection (the 101 on its way), attaches it as a channel,
/// then relays both ways until a side closes, the session is quiet both ways for `idleTimeout`,
/// or the server stops. Ending closes both sides — first letting each finish the frame in
/// progress (at most `finishTimeout`) so a close frame 1001 can go in between two frames, when
/// the ending is the gateway's own (`drained`, `idleTimeout`) — and once both sides' channels are
/// gone the session is reported, once.
struct UpgradeSessionStateMachine<Client> {
    typealias Instant = ContinuousClock.Instant

    typealias Side = RelayHandler.Side

    enum Phase {
        /// The 101 is on its way to the client: only the upstream's side exists.
        case awaitingClient
        /// The client's connection arrived at `started` and is becoming a channel.
        case attaching(Client, started: Instant)
        /// Both sides relay; bytes last moved (either way) at `lastActivity`.
        case relaying(Client, started: Instant, lastActivity: Instant)
        case ending(Ending)
        /// Both sides are gone and the session was reported.
        case reported
    }

    struct Ending {
        var reason: UpgradeEndReason
        /// Kept until the report (`nil`: it never came).
        var client: Client?
        var started: Instant?
        var closing: Closing
        /// The sides whose channels are still open.
        var open: Set<Side>
    }

    enum Closing: Equatable {
        /// Ended before the client's connection came: it is given back when it does.
        case clientNotCome
        /// Ended while the client's connection became a channel: the sides close once it has.
        case notJoined
        /// Each side finishes the frame in progress toward the other: `unsettled` still to.
        case finishingFrames(unsettled: Int)
        /// Both sides were told to close.
        case closed
    }

    /// The one timer a session asks for at a time.
    enum Timer: Equatable {
        case keep
        /// (Re)schedule it: the idle check, due at this instant (`idleCheckDue`).
        case idleCheck(at: Instant)
        /// (Re)schedule it: the limit on finishing frames (`finishTimedOut`).
        case finish(at: Instant)
        case stop
    }

    enum Close: Equatable {
        /// Start the finish timer, and ask each side to finish its frame in progress (each says
        /// `sideSettled` when it has, perhaps at once).
        case finishFrames
        /// Close both sides after what is on its way; with `goingAway`, a close frame 1001 first
        /// to each whose stream is between two frames.
        case now(goingAway: Bool)
    }

    /// What to do, in this order.
    struct Action {
        /// Give back a client connection that never became a channel (its descriptor closed first).
        var giveBack: Client?
        /// Make the client's connection a channel with its relay (then `clientAttached` or
        /// `clientAttachFailed`).
        var attach: Client?
        /// Join the two relays (this client's bytes read past its handshake go first).
        var join: Client?
        var timer = Timer.keep
        /// Close the upstream's side: there will be no client side to join it.
        var abandonUpstream = false
        var close: Close?
        /// Report the session: how it ended and how long it lasted.
        var report: (reason: UpgradeEndReason, duration: Duration)?
    }

    /// How long a side in the middle of a frame gets to finish it before the close frames.
    static var finishTimeout: Duration { .seconds(10) }

    let idleTimeout: Duration
    private(set) var phase = Phase.awaitingClient

    init(idleTimeout: Duration) {
        self.idleTimeout = idleTimeout
    }

    // MARK: The client's side

    /// libmicrohttpd handed the client's connection over (the 101 is sent).
    mutating func clientArrived(_ client: Client, now: Instant) -> Action {
        guard case .awaitingClient = phase else {
            // Ended before it came (the upstream closed, the server stopping): give it back at once.
            return Action(giveBack: client)
        }
        phase = .attaching(client, started: now)
        return Action(attach: client)
    }

    /// The client's connection is a channel.
    mutating func clientAttached(now: Instant) -> Action {
        switch phase {
        case .attaching(let client, let started):
            phase = .relaying(client, started: started, lastActivity: started)
            return Action(join: client, timer: .idleCheck(at: started.advanced(by: idleTimeout)))
        case .ending(var ending) where ending.closing == .notJoined:
            var action = Action(join: ending.client)
            closeSides(&ending, into: &action, now: now)
            phase = .ending(ending)
            return action
        case .awaitingClient, .relaying, .ending, .reported:
            return Action()
        }
    }

    /// The client's connection could not become a channel: it is given back and the session ends.
    mutating func clientAttachFailed(now: Instant) -> Action {
        let client: Client? = switch phase {
        case .attaching(let client, _): client
        case .ending(let ending) where ending.closing == .notJoined: ending.client
        default: nil
        }
        guard let client else { return Action() }
        var action = end(.clientClosed, now: now)
        if case .ending(var ending) = phase {
            // No client side will join the upstream's: it closes too.
            ending.closing = .closed
            ending.client = nil
            phase = .ending(ending)
            action.abandonUpstream = true
        }
        action.giveBack = client
        action.report = sideGone(.client, now: now).report
        return action
    }

    // MARK: While it relays

    /// Bytes moved one way or the other.
    mutating func activity(now: Instant) {
        guard case .relaying(let client, let started, _) = phase else { return }
        phase = .relaying(client, started: started, lastActivity: now)
    }

    /// The idle check's timer fired: the session ends if quiet for `idleTimeout`, else the
    /// check moves to the new due time.
    mutating func idleCheckDue(now: Instant) -> Action {
        guard case .relaying(_, _, let lastActivity) = phase else { return Action() }
        let due = lastActivity.advanced(by: idleTimeout)
        guard now >= due else { return Action(timer: .idleCheck(at: due)) }
        return end(.idleTimeout, now: now)
    }

    // MARK: Endings

    /// A side's channel closed or failed (its relay says so): the session ends, the other side closes.
    mutating func sideClosed(_ side: Side, now: Instant) -> Action {
        end(side == .client ? .clientClosed : .upstreamClosed, now: now)
    }

    /// The server is stopping and its grace is over.
    mutating func serverStopping(now: Instant) -> Action {
        end(.drained, now: now)
    }

    /// The 101 never reached the client: the upstream's side is closed.
    mutating func abandoned(now: Instant) -> Action {
        var action = end(.clientClosed, now: now)
        action.abandonUpstream = true
        return action
    }

    /// A side finished its frame in progress (`Close.finishFrames`).
    mutating func sideSettled() -> Action {
        guard case .ending(var ending) = phase, case .finishingFrames(let unsettled) = ending.closing else { return Action() }
        guard unsettled <= 1 else {
            ending.closing = .finishingFrames(unsettled: unsettled - 1)
            phase = .ending(ending)
            return Action()
        }
        ending.closing = .closed
        phase = .ending(ending)
        return Action(timer: .stop, close: .now(goingAway: true))
    }

    /// The limit on finishing frames passed: the sides close now (a side still mid-frame without
    /// a close frame).
    mutating func finishTimedOut() -> Action {
        guard case .ending(var ending) = phase, case .finishingFrames = ending.closing else { return Action() }
        ending.closing = .closed
        phase = .ending(ending)
        return Action(close: .now(goingAway: true))
    }

    /// A side's channel is gone: the session ends if it had not, and is reported once both are.
    mutating func sideGone(_ side: Side, now: Instant) -> Action {
        var action = Action()
        switch phase {
        case .awaitingClient, .attaching, .relaying:
            action = end(side == .client ? .clientClosed : .upstreamClosed, now: now)
        case .ending, .reported:
            break
        }
        guard case .ending(var ending) = phase, ending.open.remove(side) != nil else { return action }
        guard ending.open.isEmpty else {
            phase = .ending(ending)
            return action
        }
        phase = .reported
        action.report = (ending.reason, ending.started.map { $0.duration(to: now) } ?? .zero)
        return action
    }

    /// Ends the session for `reason`, once: the sides close now if both are there, when the
    /// client's joins if it is on its way, and the upstream's alone if the client's never came.
    private mutating func end(_ reason: UpgradeEndReason, now: Instant) -> Action {
        switch phase {
        case .awaitingClient:
            phase = .ending(Ending(reason: reason, client: nil, started: nil, closing: .clientNotCome, open: [.upstream]))
            return Action(abandonUpstream: true)
        case .attaching(let client, let started):
            phase = .ending(Ending(reason: reason, client: client, started: started, closing: .notJoined, open: [.upstream, .client]))
            return Action()
        case .relaying(let client, let started, _):
            var ending = Ending(reason: reason, client: client, started: started, closing: .closed, open: [.upstream, .client])
            var action = Action(timer: .stop)
            closeSides(&ending, into: &action, now: now)
            phase = .ending(ending)
            return action
        case .ending, .reported:
            return Action()
        }
    }

    /// The gateway's own endings (`drained`, `idleTimeout`) say goodbye with close frames
    /// between frames; a side that closed is followed at once.
    private func closeSides(_ ending: inout Ending, into action: inout Action, now: Instant) {
        switch ending.reason {
        case .drained, .idleTimeout:
            ending.closing = .finishingFrames(unsettled: 2)
            action.timer = .finish(at: now.advanced(by: Self.finishTimeout))
            action.close = .finishFrames
        case .clientClosed, .upstreamClosed:
            ending.closing = .closed
            action.close = .now(goingAway: false)
        }
    }
}
