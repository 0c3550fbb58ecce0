import Testing
@testable import Portico

/// An upgraded session's logic without channels: `UpgradeSessionStateMachine` driven with client
/// connections named by strings and instants given by the test; its actions compared as words.
@Suite("Upgrade session state machine")
struct UpgradeSessionStateMachineTests {
    typealias Machine = UpgradeSessionStateMachine<String>

    static let t0 = ContinuousClock.Instant.now
    static let idle = Duration.seconds(60)

    static func at(_ seconds: Int) -> ContinuousClock.Instant { t0.advanced(by: .seconds(seconds)) }

    /// Seconds since `t0`, to read instants back.
    static func seconds(_ instant: ContinuousClock.Instant) -> Int {
        Int(t0.duration(to: instant).components.seconds)
    }

    static func describe(_ action: Machine.Action) -> [String] {
        var words: [String] = []
        if let client = action.giveBack { words.append("giveBack(\(client))") }
        if let client = action.attach { words.append("attach(\(client))") }
        if let client = action.join { words.append("join(\(client))") }
        switch action.timer {
        case .keep: break
        case .idleCheck(let due): words.append("idleCheck(\(seconds(due)))")
        case .finish(let limit): words.append("finish(\(seconds(limit)))")
        case .stop: words.append("stopTimer")
        }
        if action.abandonUpstream { words.append("abandonUpstream") }
        switch action.close {
        case nil: break
        case .finishFrames: words.append("finishFrames")
        case .now(let goingAway): words.append(goingAway ? "closeGoingAway" : "close")
        }
        if let report = action.report { words.append("report(\(report.reason.rawValue), \(report.duration.components.seconds)s)") }
        return words
    }

    static func phase(_ machine: Machine) -> String {
        switch machine.phase {
        case .awaitingClient: "awaitingClient"
        case .attaching(let client, let started): "attaching(\(client), \(seconds(started)))"
        case .relaying(let client, _, let last): "relaying(\(client), last: \(seconds(last)))"
        case .ending(let ending): "ending(\(ending.reason.rawValue), \(ending.closing), open: \(ending.open.count))"
        case .reported: "reported"
        }
    }

    /// A session whose client `c` arrived at `t0 + 1s` and joined.
    static func relaying() -> Machine {
        var machine = Machine(idleTimeout: idle)
        #expect(describe(machine.clientArrived("c", now: at(1))) == ["attach(c)"])
        #expect(describe(machine.clientAttached(now: at(1))) == ["join(c)", "idleCheck(61)"])
        return machine
    }

    // MARK: Starting

    @Test("the client's connection arrives, becomes a channel and joins the upstream's; the idle check is due a timeout later")
    func start() {
        var machine = Machine(idleTimeout: Self.idle)
        #expect(Self.phase(machine) == "awaitingClient")
        #expect(Self.describe(machine.clientArrived("c", now: Self.at(1))) == ["attach(c)"])
        #expect(Self.phase(machine) == "attaching(c, 1)")
        #expect(Self.describe(machine.clientAttached(now: Self.at(2))) == ["join(c)", "idleCheck(61)"])
        #expect(Self.phase(machine) == "relaying(c, last: 1)")
    }

    @Test("a session ended before its client came gives the connection back when it comes, and closes only the upstream")
    func endedBeforeClient() {
        var machine = Machine(idleTimeout: Self.idle)
        #expect(Self.describe(machine.serverStopping(now: Self.at(1))) == ["abandonUpstream"])
        #expect(Self.describe(machine.sideGone(.upstream, now: Self.at(2))) == ["report(drained, 0s)"])
        #expect(Self.describe(machine.clientArrived("c", now: Self.at(3))) == ["giveBack(c)"])
        #expect(Self.phase(machine) == "reported")
    }

    @Test("a 101 that never reached the client closes the upstream, and the session ends as the client's")
    func abandoned() {
        var machine = Machine(idleTimeout: Self.idle)
        #expect(Self.describe(machine.abandoned(now: Self.at(1))) == ["abandonUpstream"])
        #expect(Self.describe(machine.sideGone(.upstream, now: Self.at(1))) == ["report(client_closed, 0s)"])
    }

    @Test("ended while the client's channel is being made: the sides close once it has joined")
    func endedWhileAttaching() {
        var drained = Machine(idleTimeout: Self.idle)
        _ = drained.clientArrived("c", now: Self.at(1))
        #expect(Self.describe(drained.serverStopping(now: Self.at(2))) == [])
        #expect(Self.describe(drained.clientAttached(now: Self.at(3))) == ["join(c)", "finish(13)", "finishFrames"])
        var upstreamGone = Machine(idleTimeout: Self.idle)
        _ = upstreamGone.clientArrived("c", now: Self.at(1))
        #expect(Self.describe(upstreamGone.sideGone(.upstream, now: Self.at(2))) == [])
        #expect(Self.describe(upstreamGone.clientAttached(now: Self.at(3))) == ["join(c)", "close"])
        #expect(Self.describe(upstreamGone.sideGone(.client, now: Self.at(4))) == ["report(upstream_closed, 3s)"])
    }

    @Test("a client's connection that cannot become a channel is given back, the upstream closed, the session ended")
    func attachFails() {
        var machine = Machine(idleTimeout: Self.idle)
        _ = machine.clientArrived("c", now: Self.at(1))
        #expect(Self.describe(machine.clientAttachFailed(now: Self.at(2))) == ["giveBack(c)", "abandonUpstream"])
        #expect(Self.describe(machine.sideGone(.upstream, now: Self.at(2))) == ["report(client_closed, 1s)"])
        #expect(Self.describe(machine.clientAttached(now: Self.at(3))) == [], "no join after it failed")
    }

    // MARK: The idle timeout, on the clock given

    @Test("bytes moving either way push the idle check back; quiet for the timeout, the session ends going away")
    func idleTimeout() {
        var machine = Self.relaying()
        machine.activity(now: Self.at(31))
        #expect(Self.describe(machine.idleCheckDue(now: Self.at(61))) == ["idleCheck(91)"], "not quiet for 60 s yet")
        #expect(Self.describe(machine.idleCheckDue(now: Self.at(91))) == ["finish(101)", "finishFrames"])
        #expect(Self.phase(machine) == "ending(idle_timeout, finishingFrames(unsettled: 2), open: 2)")
    }

    @Test("an idle check that comes late or after the end changes nothing")
    func lateIdleCheck() {
        var machine = Self.relaying()
        _ = machine.sideClosed(.client, now: Self.at(2))
        #expect(Self.describe(machine.idleCheckDue(now: Self.at(100))) == [])
        #expect(Self.phase(machine) == "ending(client_closed, closed, open: 2)")
    }

    // MARK: Endings

    @Test("a side closing closes the other at once, without close frames; reported once both channels are gone",
          arguments: [(RelayHandler.Side.client, "client_closed"), (.upstream, "upstream_closed")])
    func sideCloses(side: RelayHandler.Side, reason: String) {
        var machine = Self.relaying()
        #expect(Self.describe(machine.sideClosed(side, now: Self.at(5))) == ["stopTimer", "close"])
        #expect(Self.describe(machine.sideClosed(side == .client ? .upstream : .client, now: Self.at(5))) == [], "ended once")
        #expect(Self.describe(machine.sideGone(side, now: Self.at(6))) == [])
        #expect(Self.describe(machine.sideGone(side == .client ? .upstream : .client, now: Self.at(7))) == ["report(\(reason), 6s)"])
        #expect(Self.describe(machine.sideGone(.client, now: Self.at(8))) == [], "reported once")
    }

    @Test("a channel gone before its relay said it closed ends the session as that side's")
    func goneFirst() {
        var machine = Self.relaying()
        #expect(Self.describe(machine.sideGone(.upstream, now: Self.at(5))) == ["stopTimer", "close"])
        #expect(Self.describe(machine.sideGone(.client, now: Self.at(5))) == ["report(upstream_closed, 4s)"])
    }

    @Test("the server stopping lets each side finish its frame, then closes both going away")
    func drained() {
        var machine = Self.relaying()
        #expect(Self.describe(machine.serverStopping(now: Self.at(5))) == ["finish(15)", "finishFrames"])
        #expect(Self.describe(machine.serverStopping(now: Self.at(6))) == [], "it may come more than once")
        #expect(Self.describe(machine.sideSettled()) == [])
        #expect(Self.describe(machine.sideSettled()) == ["stopTimer", "closeGoingAway"])
        #expect(Self.describe(machine.finishTimedOut()) == [], "the limit no longer applies")
        _ = machine.sideGone(.client, now: Self.at(7))
        #expect(Self.describe(machine.sideGone(.upstream, now: Self.at(7))) == ["report(drained, 6s)"])
    }

    @Test("a side still mid-frame at the limit is closed anyway")
    func finishLimit() {
        var machine = Self.relaying()
        _ = machine.serverStopping(now: Self.at(5))
        _ = machine.sideSettled()
        #expect(Self.describe(machine.finishTimedOut()) == ["closeGoingAway"])
        #expect(Self.describe(machine.sideSettled()) == [], "closed once")
    }

    @Test("a side closing while the frames finish does not close them twice")
    func closedWhileFinishing() {
        var machine = Self.relaying()
        _ = machine.serverStopping(now: Self.at(5))
        #expect(Self.describe(machine.sideClosed(.client, now: Self.at(6))) == [])
        #expect(Self.describe(machine.sideGone(.client, now: Self.at(6))) == [])
        #expect(Self.phase(machine) == "ending(drained, finishingFrames(unsettled: 2), open: 1)")
    }
}
