import LockAudit
import NIOCore
import PorticoTesting
import Testing
@testable import Portico

/// The pool's logic without sockets or clocks: `ConnectionPoolStateMachine` driven with plain
/// connections, waiters named by strings and instants given by the test.
@Suite("Connection pool state machine")
struct ConnectionPoolStateMachineTests {
    /// A connection as the machine sees it: an identity, and whether the upstream still holds it open.
    final class Connection: PoolableConnection, CustomStringConvertible {
        let id: Int
        var isActive = true
        init(_ id: Int) { self.id = id }
        var description: String { "c\(id)" }
    }

    typealias Machine = ConnectionPoolStateMachine<Connection, String>

    static let t0 = NIODeadline.uptimeNanoseconds(1_000_000_000_000)
    static let idleTimeout = TimeAmount.seconds(4)

    static func machine(limit: Int, cap: SharedCap = SharedCap(name: "test.max_connections")) -> Machine {
        Machine(cap: cap, limit: limit, idleTimeout: idleTimeout)
    }

    /// One machine per loop, sharing one cap and each other's signals.
    static func loops(_ count: Int, limit: Int, cap: SharedCap) -> [Machine] {
        let signals = (0..<count).map { _ in WaitingSignal() }
        return (0..<count).map { Machine(cap: cap, limit: limit, idleTimeout: idleTimeout, signals: signals, index: $0) }
    }

    /// Leases with a slot to connect, and connects at once: the new connection, leased.
    static func open(_ machine: inout Machine, _ id: Int, now: NIODeadline = t0) -> Connection {
        let (lease, action) = machine.lease(now: now)
        #expect(action.close.isEmpty && action.handovers.isEmpty)
        guard case .connect = lease else {
            Issue.record("expected a slot to connect, got \(lease)")
            return Connection(id)
        }
        let connection = Connection(id)
        let kept = machine.connected(connection)
        #expect(kept)
        return connection
    }

    static func leased(_ lease: Machine.Lease) -> Int? {
        if case .use(let connection) = lease { connection.id } else { nil }
    }

    static func isWait(_ lease: Machine.Lease) -> Bool {
        if case .wait = lease { true } else { false }
    }

    static func isConnect(_ lease: Machine.Lease) -> Bool {
        if case .connect = lease { true } else { false }
    }

    /// Handovers as words, to compare: "a←c1", "b→connect", "c✗timeout".
    static func describe(_ handovers: [Machine.Handover]) -> [String] {
        handovers.map { handover in
            switch handover {
            case .use(let waiter, let connection): "\(waiter)←\(connection)"
            case .connect(let waiter): "\(waiter)→connect"
            case .fail(let waiter, let error): "\(waiter)✗\(error)"
            }
        }
    }

    static func ids(_ connections: [Connection]) -> [Int] { connections.map(\.id) }

    /// Asks for a connection and, told to wait, joins the queue.
    @discardableResult
    static func wait(_ machine: inout Machine, _ waiter: String, deadline: NIODeadline, failure: UpstreamError = .connectTimeout,
                     now: NIODeadline = t0) -> Machine.Action {
        let (lease, _) = machine.lease(now: now)
        #expect(isWait(lease), "\(waiter) expected to wait, got \(lease)")
        let id = machine.makeWaiterID()
        return machine.enqueue(waiter, id: id, deadline: deadline, failure: failure, now: now)
    }

    // MARK: Lease and release

    @Test("released connections are reused last in, first out; a slot is taken per new connection only")
    func lifoReuse() {
        let cap = SharedCap(name: "lifo")
        var machine = Self.machine(limit: 4, cap: cap)
        let c1 = Self.open(&machine, 1)
        let c2 = Self.open(&machine, 2)
        #expect(cap.current == 2)

        let first = machine.release(c1, reusable: true, now: Self.t0)
        #expect(first.sweep == .schedule(Self.t0 + Self.idleTimeout), "the first idle connection starts the sweep")
        let second = machine.release(c2, reusable: true, now: Self.t0 + .seconds(1))
        #expect(second.sweep == .keep, "one sweep timer for the loop")
        #expect(machine.idleCount == 2)

        let newestFirst = Self.leased(machine.lease(now: Self.t0 + .seconds(2)).0) == 2
        #expect(newestFirst, "the most recently used first")
        let thenOlder = Self.leased(machine.lease(now: Self.t0 + .seconds(2)).0) == 1
        #expect(thenOlder)
        #expect(cap.current == 2, "reusing a connection does not touch the cap")
        let opensNew = Self.isConnect(machine.lease(now: Self.t0 + .seconds(2)).0)
        #expect(opensNew, "none idle: a slot for a new one")
        #expect(cap.current == 3)
        #expect(machine.connectionCount == 3)
    }

    @Test("a connection that may not be reused is closed and its slot given back")
    func notReusableClosed() {
        let cap = SharedCap(name: "closed")
        var machine = Self.machine(limit: 2, cap: cap)
        let c1 = Self.open(&machine, 1)
        let action = machine.release(c1, reusable: false, now: Self.t0)
        #expect(Self.ids(action.close) == [1])
        #expect(action.slotFreed, "other loops may want the slot")
        #expect(cap.current == 0)
        #expect(machine.connectionCount == 0)
    }

    @Test("a connection that switched protocols leaves the pool open: its slot goes back (to a waiter first), it is not closed")
    func detachedForUpgrade() {
        let cap = SharedCap(name: "detached")
        var machine = Self.machine(limit: 1, cap: cap)
        let c1 = Self.open(&machine, 1)
        Self.wait(&machine, "a", deadline: Self.t0 + .seconds(2))
        let action = machine.detach(c1, now: Self.t0)
        #expect(action.close.isEmpty, "the tunnel owns the connection now")
        #expect(Self.describe(action.handovers) == ["a→connect"])
        #expect(cap.current == 1, "the waiter's new connection holds the slot")
        #expect(machine.connectionCount == 1)
        // Released later by mistake (or shut down): the pool no longer knows it.
        #expect(machine.release(c1, reusable: true, now: Self.t0).close.isEmpty)
        #expect(machine.shutdown().close.isEmpty)
    }

    @Test("a failed connect gives its slot back")
    func connectFailed() {
        let cap = SharedCap(name: "failed")
        var machine = Self.machine(limit: 1, cap: cap)
        let connects = Self.isConnect(machine.lease(now: Self.t0).0)
        #expect(connects)
        #expect(cap.current == 1)
        _ = machine.connectFailed(now: Self.t0)
        #expect(cap.current == 0)
        let connectsAgain = Self.isConnect(machine.lease(now: Self.t0).0)
        #expect(connectsAgain)
    }

    // MARK: Waiters

    @Test("at the cap, requests wait and are served in order: a released connection, then a freed slot")
    func waitersInOrder() {
        let cap = SharedCap(name: "order")
        var machine = Self.machine(limit: 1, cap: cap)
        let c1 = Self.open(&machine, 1)

        let a = Self.wait(&machine, "a", deadline: Self.t0 + .seconds(2))
        #expect(a.handovers.isEmpty)
        #expect(a.waiterTimer == .schedule(Self.t0 + .seconds(2)))
        #expect(a.askForIdle, "nothing idle here: other loops are asked for one")
        #expect(machine.signal.isWaiting)
        let b = Self.wait(&machine, "b", deadline: Self.t0 + .seconds(2))
        #expect(b.waiterTimer == .keep, "the timer already fires by then")
        Self.wait(&machine, "c", deadline: Self.t0 + .seconds(2))
        #expect(machine.waiterCount == 3)

        let reused = machine.release(c1, reusable: true, now: Self.t0)
        #expect(Self.describe(reused.handovers) == ["a←c1"], "the first waiter gets the connection itself")
        #expect(machine.idleCount == 0)

        let closed = machine.release(c1, reusable: false, now: Self.t0)
        #expect(Self.ids(closed.close) == [1])
        #expect(Self.describe(closed.handovers) == ["b→connect"], "the next one gets the slot")
        #expect(!closed.slotFreed, "the slot stayed on this loop")
        #expect(cap.current == 1)
        #expect(machine.waiterCount == 1)

        // A newcomer does not jump the queue, even with a slot free.
        _ = machine.connectFailed(now: Self.t0)
        #expect(machine.waiterCount == 0, "c took the slot b's failed connect gave back")
        #expect(!machine.signal.isWaiting)
    }

    @Test("waiters fail at their own deadline with their own failure; one timer, moved to the next deadline")
    func waiterTimeout() {
        var machine = Self.machine(limit: 1)
        _ = Self.open(&machine, 1)
        let late = Self.wait(&machine, "late", deadline: Self.t0 + .seconds(2), failure: .connectTimeout)
        #expect(late.waiterTimer == .schedule(Self.t0 + .seconds(2)))
        let soon = Self.wait(&machine, "soon", deadline: Self.t0 + .seconds(1), failure: .timeout)
        #expect(soon.waiterTimer == .schedule(Self.t0 + .seconds(1)), "an earlier deadline moves the timer")

        let first = machine.waiterTimerFired(now: Self.t0 + .seconds(1))
        #expect(Self.describe(first.handovers) == ["soon✗timeout"])
        #expect(first.waiterTimer == .schedule(Self.t0 + .seconds(2)))
        #expect(machine.signal.isWaiting)

        let second = machine.waiterTimerFired(now: Self.t0 + .seconds(2))
        #expect(Self.describe(second.handovers) == ["late✗connectTimeout"])
        #expect(second.waiterTimer == .keep, "nobody left to time")
        #expect(machine.waiterCount == 0)
        #expect(!machine.signal.isWaiting)
    }

    @Test("a cancelled waiter leaves the queue; one already served is not returned")
    func cancelWaiter() {
        var machine = Self.machine(limit: 1)
        let c1 = Self.open(&machine, 1)
        let waits = Self.isWait(machine.lease(now: Self.t0).0)
        #expect(waits)
        let a = machine.makeWaiterID()
        _ = machine.enqueue("a", id: a, deadline: Self.t0 + .seconds(2), failure: .connectTimeout, now: Self.t0)
        let b = machine.makeWaiterID()
        _ = machine.enqueue("b", id: b, deadline: Self.t0 + .seconds(2), failure: .connectTimeout, now: Self.t0)
        let cancelled = machine.cancelWaiter(a) == "a"
        #expect(cancelled)
        let cancelledTwice = machine.cancelWaiter(a) == nil
        #expect(cancelledTwice)
        let servedB = Self.describe(machine.release(c1, reusable: true, now: Self.t0).handovers) == ["b←c1"]
        #expect(servedB)
        let servedNotCancelled = machine.cancelWaiter(b) == nil
        #expect(servedNotCancelled, "served already")
    }

    // MARK: Idle connections

    @Test("idle connections expire idle_timeout after their last use: at the sweep, or when leased")
    func idleExpiry() {
        let cap = SharedCap(name: "expiry")
        var machine = Self.machine(limit: 4, cap: cap)
        let c1 = Self.open(&machine, 1)
        let c2 = Self.open(&machine, 2)
        _ = machine.release(c1, reusable: true, now: Self.t0)
        _ = machine.release(c2, reusable: true, now: Self.t0 + .seconds(1))

        let early = machine.sweepFired(now: Self.t0 + .seconds(3))
        #expect(early.close.isEmpty)
        #expect(early.sweep == .schedule(Self.t0 + Self.idleTimeout), "rescheduled for the oldest")

        let sweep = machine.sweepFired(now: Self.t0 + Self.idleTimeout)
        #expect(Self.ids(sweep.close) == [1])
        #expect(sweep.slotFreed)
        #expect(sweep.sweep == .schedule(Self.t0 + .seconds(1) + Self.idleTimeout), "next: when c2 expires")
        #expect(cap.current == 1)

        // Past its time, c2 is not leased even before the sweep comes round.
        let (lease, action) = machine.lease(now: Self.t0 + .seconds(1) + Self.idleTimeout)
        #expect(Self.ids(action.close) == [2])
        #expect(Self.isConnect(lease))
        #expect(cap.current == 1)
        let noSweep = machine.sweepFired(now: Self.t0 + .seconds(9)).sweep == .keep
        #expect(noSweep, "nothing idle: no sweep")
    }

    @Test("connections the upstream closed are not leased, and are closed")
    func staleConnections() {
        let cap = SharedCap(name: "stale")
        var machine = Self.machine(limit: 4, cap: cap)
        let c1 = Self.open(&machine, 1)
        let c2 = Self.open(&machine, 2)
        _ = machine.release(c1, reusable: true, now: Self.t0)
        _ = machine.release(c2, reusable: true, now: Self.t0)
        c2.isActive = false
        let (lease, action) = machine.lease(now: Self.t0)
        #expect(Self.leased(lease) == 1)
        #expect(Self.ids(action.close) == [2])
        #expect(cap.current == 1)

        // Released "reusable" after the upstream closed it: closed, not kept.
        c1.isActive = false
        let release = machine.release(c1, reusable: true, now: Self.t0)
        #expect(Self.ids(release.close) == [1])
        #expect(machine.idleCount == 0)

        // The sweep closes a dead idle connection before its time.
        let c3 = Self.open(&machine, 3)
        _ = machine.release(c3, reusable: true, now: Self.t0)
        c3.isActive = false
        let sweptDead = Self.ids(machine.sweepFired(now: Self.t0 + .seconds(1)).close) == [3]
        #expect(sweptDead)
        #expect(cap.current == 0)
    }

    // MARK: Shutdown

    @Test("shutdown closes every connection, fails waiters, cancels timers; later requests fail")
    func shutdown() {
        let cap = SharedCap(name: "shutdown")
        var machine = Self.machine(limit: 3, cap: cap)
        let c1 = Self.open(&machine, 1)
        let c2 = Self.open(&machine, 2)
        _ = machine.release(c2, reusable: true, now: Self.t0)
        let leasedIdle = Self.leased(machine.lease(now: Self.t0).0) == 2
        #expect(leasedIdle)
        let connecting = Self.isConnect(machine.lease(now: Self.t0).0)
        #expect(connecting, "a third, still connecting")
        Self.wait(&machine, "a", deadline: Self.t0 + .seconds(2))
        let action = machine.shutdown()
        #expect(Set(Self.ids(action.close)) == [1, 2])
        #expect(Self.describe(action.handovers) == ["a✗connectFailed(\"client is shut down\")"])
        #expect(action.waiterTimer == .cancel)
        #expect(!machine.signal.isWaiting)
        #expect(cap.current == 1, "the connection being opened still holds its slot")

        let refusedAfterShutdown = !machine.connected(Connection(3))
        #expect(refusedAfterShutdown, "it is closed when it comes")
        #expect(cap.current == 0)
        guard case .shutDown = machine.lease(now: Self.t0).0 else {
            Issue.record("a lease after shutdown must fail")
            return
        }
        let late = machine.release(c1, reusable: true, now: Self.t0)
        #expect(late.close.isEmpty && late.handovers.isEmpty, "closed at shutdown already")
        #expect(machine.idleCount == 0)
        let enqueued = machine.enqueue("b", id: machine.makeWaiterID(), deadline: Self.t0, failure: .timeout, now: Self.t0)
        #expect(Self.describe(enqueued.handovers) == ["b✗connectFailed(\"client is shut down\")"])
        #expect(cap.current == 0)
    }

    @Test("shutdown with idle connections cancels the sweep")
    func shutdownCancelsSweep() {
        var machine = Self.machine(limit: 2)
        let c1 = Self.open(&machine, 1)
        _ = machine.release(c1, reusable: true, now: Self.t0)
        let action = machine.shutdown()
        #expect(action.sweep == .cancel)
        #expect(Self.ids(action.close) == [1])
        let secondShutdownIsNoop = machine.shutdown().close.isEmpty
        #expect(secondShutdownIsNoop, "once")
    }

    @Test("retire (a reload): idle connections close, leases are refused; a leased connection stays open until released, then closes")
    func retire() {
        let cap = SharedCap(name: "retire")
        var machine = Self.machine(limit: 3, cap: cap)
        let streaming = Self.open(&machine, 1)
        let connecting = Self.isConnect(machine.lease(now: Self.t0).0)
        #expect(connecting, "a second, still connecting")
        let idle = Self.open(&machine, 2)
        _ = machine.release(idle, reusable: true, now: Self.t0)

        let action = machine.retire()
        #expect(Self.ids(action.close) == [2], "only the idle one")
        #expect(action.sweep == .cancel)
        #expect(!machine.isDrained && cap.current == 2)
        let leaseRefused = if case .shutDown = machine.lease(now: Self.t0).0 { true } else { false }
        #expect(leaseRefused)

        // The connection being opened started before the retirement: its request uses it.
        let late = Connection(3)
        let kept = machine.connected(late)
        #expect(kept)
        // Released, even reusable, each one closes.
        #expect(Self.ids(machine.release(streaming, reusable: true, now: Self.t0 + .seconds(60)).close) == [1])
        #expect(!machine.isDrained)
        #expect(Self.ids(machine.release(late, reusable: true, now: Self.t0 + .seconds(60)).close) == [3])
        #expect(machine.isDrained && cap.current == 0 && machine.idleCount == 0)
        #expect(machine.retire().close.isEmpty, "once")
    }

    @Test("retire fails the requests waiting for a connection; a later shutdown closes the connections still leased")
    func shutdownAfterRetire() {
        var machine = Self.machine(limit: 1)
        let streaming = Self.open(&machine, 1)
        Self.wait(&machine, "a", deadline: Self.t0 + .seconds(2))
        let retired = machine.retire()
        #expect(Self.describe(retired.handovers) == ["a✗connectFailed(\"client is shut down\")"])
        #expect(retired.waiterTimer == .cancel && !machine.signal.isWaiting)
        #expect(Self.ids(machine.shutdown().close) == [1])
        #expect(machine.isDrained && machine.isShutDown)
        #expect(machine.release(streaming, reusable: true, now: Self.t0).close.isEmpty, "closed at shutdown already")
    }

    // MARK: The cap across loops

    @Test("two loops' machines sharing one cap: neither exceeds the total; a slot freed on one serves the other's waiter")
    func capAcrossLoops() {
        let cap = SharedCap(name: "upstreams.shared.max_connections")
        var machines = Self.loops(2, limit: 3, cap: cap)
        var loop0 = machines.removeFirst()
        var loop1 = machines.removeFirst()
        let c1 = Self.open(&loop0, 1)
        _ = Self.open(&loop0, 2)
        _ = Self.open(&loop1, 3)
        #expect(cap.current == 3)

        // Both loops are at the cap: whatever they ask, no fourth connection.
        for _ in 0..<3 {
            let loop0Waits = Self.isWait(loop0.lease(now: Self.t0).0)
            #expect(loop0Waits)
            let loop1Waits = Self.isWait(loop1.lease(now: Self.t0).0)
            #expect(loop1Waits)
        }
        #expect(cap.current == 3)
        #expect(loop0.connectionCount + loop1.connectionCount == 3)

        // Loop 1's request waits, and loop 1 says so.
        let waited = Self.wait(&loop1, "x", deadline: Self.t0 + .seconds(2))
        #expect(waited.askForIdle, "nothing idle on loop 1")
        #expect(loop1.signal.isWaiting)
        #expect(!loop0.signal.isWaiting)

        // Loop 0 closes a connection: the slot is announced, loop 1's waiter takes it.
        let closed = loop0.release(c1, reusable: false, now: Self.t0)
        #expect(closed.slotFreed)
        #expect(cap.current == 2)
        let served = Self.describe(loop1.slotMayBeFree(now: Self.t0).handovers) == ["x→connect"]
        #expect(served)
        #expect(cap.current == 3)
        #expect(loop1.connectionCount == 2)
        #expect(!loop1.signal.isWaiting)
        let loop0StillWaits = Self.isWait(loop0.lease(now: Self.t0).0)
        #expect(loop0StillWaits, "the slot went to loop 1")
    }

    @Test("a loop with an idle connection gives it up for another loop's waiter; the freed slot reaches the waiter")
    func idleGivenUpForOtherLoop() {
        let cap = SharedCap(name: "upstreams.steal.max_connections")
        var machines = Self.loops(2, limit: 2, cap: cap)
        var loop0 = machines.removeFirst()
        var loop1 = machines.removeFirst()
        let c1 = Self.open(&loop0, 1)
        let c2 = Self.open(&loop0, 2)
        _ = loop0.release(c1, reusable: true, now: Self.t0)
        _ = loop0.release(c2, reusable: true, now: Self.t0)
        #expect(cap.current == 2)

        let waited = Self.wait(&loop1, "x", deadline: Self.t0 + .seconds(2))
        #expect(waited.askForIdle)
        #expect(loop1.connectionCount == 0 && cap.current == 2, "loop 1 cannot open one: the cap is reached")

        let (closed, given) = loop0.closeIdleForOtherLoop()
        #expect(closed)
        #expect(Self.ids(given.close) == [1], "the least recently used one")
        #expect(given.slotFreed)
        #expect(cap.current == 1)
        #expect(loop1.signal.isWaiting, "loop 0 sees loop 1 waiting")

        let served = loop1.slotMayBeFree(now: Self.t0)
        #expect(Self.describe(served.handovers) == ["x→connect"])
        #expect(cap.current == 2)
        #expect(!loop1.signal.isWaiting)
        #expect(loop0.connectionCount + loop1.connectionCount == cap.current)

        // A loop with requests waiting of its own keeps its idle connections (it has none anyway
        // by then); one with nothing idle says so and the ask goes on.
        let nothingToGive = !loop1.closeIdleForOtherLoop().0
        #expect(nothingToGive)
    }

    @Test("a connection closed on one loop frees a slot that another loop's waiter takes")
    func closeOnOneLoopServesOther() {
        let cap = SharedCap(name: "upstreams.close.max_connections")
        var machines = Self.loops(2, limit: 1, cap: cap)
        var loop0 = machines.removeFirst()
        var loop1 = machines.removeFirst()
        let c1 = Self.open(&loop0, 1)
        Self.wait(&loop1, "x", deadline: Self.t0 + .seconds(2))
        let nothingFree = Self.describe(loop1.slotMayBeFree(now: Self.t0).handovers).isEmpty
        #expect(nothingFree, "nothing free yet")

        let closed = loop0.release(c1, reusable: false, now: Self.t0)
        #expect(closed.slotFreed)
        #expect(loop1.signal.isWaiting)
        let servedAfterClose = Self.describe(loop1.slotMayBeFree(now: Self.t0).handovers) == ["x→connect"]
        #expect(servedAfterClose)
        #expect(cap.current == 1)
        let loop0Waits = Self.isWait(loop0.lease(now: Self.t0).0)
        #expect(loop0Waits, "loop 1 holds the only slot now")
    }

    @Test("at the cap, a connection given back while another loop waits is closed for it, not kept idle")
    func releaseAtCapServesOtherLoop() {
        let cap = SharedCap(name: "upstreams.release.max_connections")
        var machines = Self.loops(2, limit: 1, cap: cap)
        var loop0 = machines.removeFirst()
        var loop1 = machines.removeFirst()
        let c1 = Self.open(&loop0, 1)
        Self.wait(&loop1, "x", deadline: Self.t0 + .seconds(2))

        let released = loop0.release(c1, reusable: true, now: Self.t0)
        #expect(Self.ids(released.close) == [1], "closed rather than kept idle")
        #expect(released.slotFreed)
        #expect(loop0.idleCount == 0)
        let served = Self.describe(loop1.slotMayBeFree(now: Self.t0).handovers) == ["x→connect"]
        #expect(served)

        // Nobody waits any more: the next one given back stays idle.
        let c2 = Connection(2)
        let connected = loop1.connected(c2)
        #expect(connected)
        let kept = loop1.release(c2, reusable: true, now: Self.t0)
        #expect(kept.close.isEmpty)
        #expect(loop1.idleCount == 1)
    }

    @Test("below the cap, loops never hear of each other: a release keeps its connection even with another loop waiting")
    func belowCapNoCrossTalk() {
        let cap = SharedCap(name: "upstreams.below.max_connections")
        var machines = Self.loops(2, limit: 4, cap: cap)
        var loop0 = machines.removeFirst()
        let c1 = Self.open(&loop0, 1)
        machines[0].signal.value.store(true, ordering: .relaxed)  // as if loop 1 waited (it cannot below the cap)
        let released = loop0.release(c1, reusable: true, now: Self.t0)
        #expect(released.close.isEmpty && !released.slotFreed && !released.askForIdle)
        #expect(loop0.idleCount == 1)
    }

    @Test("thousands of random transitions on two loops: the cap holds and the counts add up")
    func randomTransitionsKeepTheCap() {
        let limit = 5
        let cap = SharedCap(name: "upstreams.random.max_connections")
        var machines = Self.loops(2, limit: limit, cap: cap)
        var leased: [[Connection]] = [[], []]
        var connecting = [0, 0]
        var waiting: [[(Machine.WaiterID, String)]] = [[], []]
        var random = SplitMix64(state: 33)
        var nextID = 0
        var now = Self.t0

        func apply(_ action: Machine.Action, on loop: Int) {
            for handover in action.handovers {
                switch handover {
                case .use(let waiter, let connection):
                    waiting[loop].removeAll { $0.1 == waiter }
                    leased[loop].append(connection)
                case .connect(let waiter):
                    waiting[loop].removeAll { $0.1 == waiter }
                    connecting[loop] += 1
                case .fail(let waiter, _):
                    waiting[loop].removeAll { $0.1 == waiter }
                }
            }
        }

        for step in 0..<5_000 {
            let loop = Int(random.next() % 2)
            now = now + .milliseconds(Int64(random.next() % 500))
            switch random.next() % 8 {
            case 0, 1:
                let (lease, action) = machines[loop].lease(now: now)
                apply(action, on: loop)
                switch lease {
                case .use(let connection): leased[loop].append(connection)
                case .connect: connecting[loop] += 1
                case .wait:
                    let id = machines[loop].makeWaiterID()
                    let name = "w\(step)"
                    waiting[loop].append((id, name))
                    apply(machines[loop].enqueue(name, id: id, deadline: now + .seconds(2), failure: .connectTimeout, now: now),
                          on: loop)
                case .shutDown: Issue.record("not shut down")
                }
            case 2:
                guard connecting[loop] > 0 else { continue }
                connecting[loop] -= 1
                if random.next() % 5 == 0 {
                    apply(machines[loop].connectFailed(now: now), on: loop)
                } else {
                    nextID += 1
                    let connection = Connection(nextID)
                    let connected = machines[loop].connected(connection)
                    #expect(connected)
                    leased[loop].append(connection)
                }
            case 3, 4:
                guard !leased[loop].isEmpty else { continue }
                let connection = leased[loop].remove(at: Int(random.next() % UInt64(leased[loop].count)))
                if random.next() % 10 == 0 { connection.isActive = false }
                apply(machines[loop].release(connection, reusable: random.next() % 4 != 0, now: now), on: loop)
            case 5:
                apply(machines[loop].sweepFired(now: now), on: loop)
            case 6:
                apply(machines[loop].waiterTimerFired(now: now), on: loop)
                let other = 1 - loop
                let (_, action) = machines[other].closeIdleForOtherLoop()
                apply(action, on: other)
                apply(machines[loop].slotMayBeFree(now: now), on: loop)
            default:
                if let (id, name) = waiting[loop].first, random.next() % 2 == 0 {
                    let cancelledFirst = machines[loop].cancelWaiter(id) == name
                    #expect(cancelledFirst)
                    waiting[loop].removeFirst()
                }
            }
            #expect(cap.current <= limit, "step \(step)")
            #expect(machines[0].connectionCount + machines[1].connectionCount == cap.current, "step \(step)")
            for index in 0..<2 {
                #expect(machines[index].connectionCount == leased[index].count + connecting[index] + machines[index].idleCount,
                        "step \(step) loop \(index)")
                #expect(machines[index].waiterCount == waiting[index].count, "step \(step) loop \(index)")
                #expect(machines[index].idleCount == 0 || machines[index].waiterCount == 0, "nobody waits beside an idle connection")
                #expect(machines[index].signal.isWaiting == (machines[index].waiterCount > 0))
            }
        }
        for loop in 0..<2 {
            let action = machines[loop].shutdown()
            apply(action, on: loop)
            #expect(waiting[loop].isEmpty)
            for _ in 0..<connecting[loop] { let lateRefused = !machines[loop].connected(Connection(-1)); #expect(lateRefused) }
        }
        #expect(cap.current == 0, "every slot given back")
    }
}
