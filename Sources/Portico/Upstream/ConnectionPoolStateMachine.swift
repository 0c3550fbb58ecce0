import LockAudit
import NIOCore
import Synchronization

// Just over 450 lines: one pure state machine (its states, events and the actions it returns)
// with the model test in ConnectionPoolStateMachineTests; its transitions split across files
// would hide which state each one handles.

/// What a `ConnectionPoolStateMachine` needs of a connection: an identity (to find it again at
/// shutdown) and whether it is still open.
protocol PoolableConnection {
    associatedtype ID: Hashable
    var id: ID { get }
    var isActive: Bool { get }
}

/// "This loop has requests waiting at the cap": the one word a loop's pool publishes to the
/// others. Written only when a loop's waiter queue becomes empty or non-empty (so only at the
/// cap), read by a loop that frees a slot of the cap (so only on a connection's close): below
/// the cap nobody writes it and its cache line stays shared by every core.
final class WaitingSignal: Sendable {
    let value = Atomic<Bool>(false)

    var isWaiting: Bool { value.load(ordering: .relaxed) }
}

/// The logic of one event loop's share of an `HTTP1ConnectionPool`, as a value: transitions
/// return what to do (`Action`), the pool does it. No sockets, no clock (every transition that
/// needs the time is given `now`), no threads: one instance belongs to one loop, and only that
/// loop mutates it. Generic over the connection, so tests drive it with plain values.
///
/// Connections of this loop are open (idle or leased) or connecting; together they hold slots
/// of `cap`, the upstream's `max_connections` shared with the other loops' machines: one slot
/// is taken (`SharedCap.tryAcquire`) when a connection is to be opened and given back when it
/// closes or fails to open — never per request. A request that finds no idle connection and no
/// free slot waits in this loop's queue (first come, first served) until a connection here is
/// released, a slot frees up here or elsewhere (`slotMayBeFree`), or its deadline passes.
///
/// Idle connections are reused last in, first out, so the least used ones expire (one sweep
/// timer per loop: `Action.sweep`). Waiters' deadlines share one timer too (`Action.waiterTimer`).
struct ConnectionPoolStateMachine<Connection: PoolableConnection, Waiter> {
    struct WaiterID: Hashable, Sendable {
        fileprivate var raw: Int
    }

    /// What a request that asks for a connection does next.
    enum Lease {
        /// Use this idle connection.
        case use(Connection)
        /// A slot is taken for it: open a connection (then `connected` or `connectFailed`).
        case connect
        /// No connection and no free slot: wait (`enqueue`).
        case wait
        /// The pool is shut down.
        case shutDown
    }

    /// What a waiting request gets.
    enum Handover {
        case use(Waiter, Connection)
        /// A slot is taken for it: it opens a connection (then `connected` or `connectFailed`).
        case connect(Waiter)
        case fail(Waiter, UpstreamError)
    }

    enum Timer: Equatable {
        case keep
        /// (Re)schedule it at this instant, replacing the one scheduled.
        case schedule(NIODeadline)
        case cancel
    }

    /// Everything a transition asks the pool to do. Empty on the common paths (a lease of an
    /// idle connection, a release to the idle list): no array is allocated there.
    struct Action {
        /// Waiting requests to resume, in order.
        var handovers: [Handover] = []
        /// Connections to close (their slots are already given back).
        var close: [Connection] = []
        var sweep: Timer = .keep
        var waiterTimer: Timer = .keep
        /// A slot of the shared cap was given back and no request here took it: a loop whose
        /// `WaitingSignal` is up should hear of it (`slotMayBeFree`).
        var slotFreed = false
        /// A request here waits at the cap and this loop has no idle connection: another loop
        /// should give up one of its idle connections (`closeIdleForOtherLoop`).
        var askForIdle = false

        static var none: Action { Action() }
    }

    private struct IdleEntry {
        var connection: Connection
        /// When it went idle.
        var since: NIODeadline
    }

    private struct WaiterEntry {
        var id: WaiterID
        var waiter: Waiter
        var deadline: NIODeadline
        /// What it fails with at `deadline`.
        var failure: UpstreamError
    }

    private enum Phase {
        case running
        /// Retired by a reload: no new leases; leased connections stay open until released,
        /// then close (their exchanges finish on their own terms).
        case retiring
        case shutDown
    }

    static var shutDownError: UpstreamError { .connectFailed("client is shut down") }

    let cap: SharedCap
    /// `max_connections` (at least 1), for the whole upstream.
    let limit: Int
    let idleTimeout: TimeAmount
    /// Every loop's signal (see `WaitingSignal`), this loop's at `index`.
    let signals: [WaitingSignal]
    let index: Int
    var signal: WaitingSignal { signals[index] }

    private var phase = Phase.running
    /// Most recently used last.
    private var idle: [IdleEntry] = []
    /// Every open connection of this loop, idle or leased: each holds one slot of `cap`.
    private var open: [Connection.ID: Connection] = [:]
    /// Connections being opened: each holds one slot of `cap`.
    private var connecting = 0
    private var waiters = CircularBuffer<WaiterEntry>()
    private var nextWaiterID = 0
    /// When the sweep timer fires, while one is scheduled.
    private var sweepAt: NIODeadline?
    /// When the waiter timer fires, while one is scheduled.
    private var waiterTimerAt: NIODeadline?

    /// One loop's share: `signals` has one signal per loop sharing `cap`, this one's at `index`.
    init(cap: SharedCap, limit: Int, idleTimeout: TimeAmount, signals: [WaitingSignal] = [WaitingSignal()], index: Int = 0) {
        precondition(signals.indices.contains(index), "one signal per loop")
        self.cap = cap
        self.limit = max(1, limit)
        self.idleTimeout = idleTimeout
        self.signals = signals
        self.index = index
    }

    /// Slots this loop holds: open connections and connections being opened.
    var connectionCount: Int { open.count + connecting }
    var idleCount: Int { idle.count }
    var waiterCount: Int { waiters.count }
    var isShutDown: Bool { if case .shutDown = phase { true } else { false } }
    /// Retired or shut down, and no connection of this loop is open or being opened.
    var isDrained: Bool { if case .running = phase { false } else { open.isEmpty && connecting == 0 } }

    // MARK: Requests

    /// A request asks for a connection: the most recently used idle one that is still usable
    /// (stale ones are closed on the way), else a slot to open one, else it must wait. Requests
    /// already waiting keep their turn: a newcomer waits behind them.
    mutating func lease(now: NIODeadline) -> (Lease, Action) {
        guard case .running = phase else { return (.shutDown, .none) }
        var action = Action.none
        if let connection = popUsableIdle(now: now, into: &action) {
            if !action.close.isEmpty { slotsFreed(into: &action) }
            return (.use(connection), action)
        }
        // Whoever waits goes first (a slot freed elsewhere may not have been announced yet).
        serveWaiters(now: now, into: &action)
        if waiters.isEmpty, takeSlot() {
            connecting += 1
            return (.connect, action)
        }
        if !action.close.isEmpty && action.handovers.isEmpty { slotsFreed(into: &action) }
        return (.wait, action)
    }

    mutating func makeWaiterID() -> WaiterID {
        defer { nextWaiterID += 1 }
        return WaiterID(raw: nextWaiterID)
    }

    /// A request that was told to `.wait` joins the queue, to be served in turn, or failed with
    /// `failure` at `deadline`. It may be served at once (in `Action.handovers`).
    mutating func enqueue(_ waiter: Waiter, id: WaiterID, deadline: NIODeadline, failure: UpstreamError,
                          now: NIODeadline) -> Action {
        guard case .running = phase else {
            return Action(handovers: [.fail(waiter, Self.shutDownError)])
        }
        var action = Action.none
        waiters.append(WaiterEntry(id: id, waiter: waiter, deadline: deadline, failure: failure))
        if waiters.count == 1 {
            // Up before this loop tries the cap (in `serveWaiters`), so that a loop freeing a
            // slot either sees the signal or its slot is seen here: the fences pair up
            // (`slotsFreed`), as in Dekker's protocol.
            signal.value.store(true, ordering: .relaxed)
            atomicMemoryFence(ordering: .sequentiallyConsistent)
        }
        serveWaiters(now: now, into: &action)
        if waiters.contains(where: { $0.id == id }) {
            if idle.isEmpty { action.askForIdle = true }
            if waiterTimerAt.map({ deadline < $0 }) ?? true {
                waiterTimerAt = deadline
                action.waiterTimer = .schedule(deadline)
            }
        }
        return action
    }

    /// A waiting request was cancelled: its waiter, unless it was served or failed already.
    mutating func cancelWaiter(_ id: WaiterID) -> Waiter? {
        guard let index = waiters.firstIndex(where: { $0.id == id }) else { return nil }
        let entry = waiters.remove(at: index)
        if waiters.isEmpty { lowerSignal() }
        return entry.waiter
    }

    /// The waiter timer fired: requests whose deadline has passed fail.
    mutating func waiterTimerFired(now: NIODeadline) -> Action {
        waiterTimerAt = nil
        var action = Action.none
        guard !waiters.isEmpty else { return action }
        var kept = CircularBuffer<WaiterEntry>(initialCapacity: waiters.count)
        var next: NIODeadline?
        for entry in waiters {
            if entry.deadline <= now {
                action.handovers.append(.fail(entry.waiter, entry.failure))
            } else {
                kept.append(entry)
                next = min(next ?? entry.deadline, entry.deadline)
            }
        }
        waiters = kept
        if waiters.isEmpty { lowerSignal() }
        if let next {
            waiterTimerAt = next
            action.waiterTimer = .schedule(next)
        }
        return action
    }

    // MARK: Connections

    /// A connection opened for a `.connect` (the request's own or a waiter's). `false`: the pool
    /// was shut down meanwhile; close it (its slot is given back) and fail the request.
    mutating func connected(_ connection: Connection) -> Bool {
        connecting -= 1
        if case .shutDown = phase {
            cap.release()
            return false
        }
        // Retiring: the request that asked for it started before the retirement; it is closed
        // when released.
        open[connection.id] = connection
        return true
    }

    /// Opening a connection failed: its slot goes to the next waiter, or back to the cap.
    mutating func connectFailed(now: NIODeadline) -> Action {
        connecting -= 1
        cap.release()
        var action = Action.none
        guard case .running = phase else { return action }
        serveWaiters(now: now, into: &action)
        return action
    }

    /// A request is done with its connection. A reusable, still open connection goes to the
    /// first waiter, else to the idle list — unless the cap is reached and another loop has
    /// requests waiting: then, as any other, it is closed and its slot goes to the first waiter
    /// here (to open a connection) or back to the cap, for the other loop.
    mutating func release(_ connection: Connection, reusable: Bool, now: NIODeadline) -> Action {
        var action = Action.none
        // At shutdown every open connection was closed and its slot given back.
        guard open[connection.id] != nil else { return action }
        switch phase {
        case .running: break
        case .shutDown: return action
        case .retiring:
            open[connection.id] = nil
            cap.release()
            action.close.append(connection)
            return action
        }
        if reusable && connection.isActive {
            if let first = waiters.popFirst() {
                if waiters.isEmpty { lowerSignal() }
                action.handovers.append(.use(first.waiter, connection))
                return action
            }
            if !otherLoopsWait() {
                idle.append(IdleEntry(connection: connection, since: now))
                if sweepAt == nil {
                    sweepAt = now + idleTimeout
                    action.sweep = .schedule(now + idleTimeout)
                }
                return action
            }
        }
        open[connection.id] = nil
        cap.release()
        action.close.append(connection)
        serveWaiters(now: now, into: &action)
        if waiters.isEmpty { slotsFreed(into: &action) }
        return action
    }

    /// A leased connection turned out stale (`StaleConnection`) and its request goes out once
    /// more: the connection leaves the pool (the caller closes it) and its slot passes to a new
    /// one being opened (then `connected` or `connectFailed`), so the resend neither waits at
    /// the cap nor takes an idle connection, which may be as stale. `false`: shut down meanwhile
    /// (the slot went back with the connection).
    mutating func replace(_ connection: Connection) -> Bool {
        guard !isShutDown, open.removeValue(forKey: connection.id) != nil else { return false }
        connecting += 1
        return true
    }

    /// A connection leaves the pool for good, open (it switched protocols: `UpstreamTunnel`):
    /// its slot of the cap is given back, as for a closed one, but it is not closed.
    mutating func detach(_ connection: Connection, now: NIODeadline) -> Action {
        var action = Action.none
        guard case .running = phase, open.removeValue(forKey: connection.id) != nil else { return action }
        cap.release()
        serveWaiters(now: now, into: &action)
        if waiters.isEmpty { slotsFreed(into: &action) }
        return action
    }

    /// The sweep timer fired: idle connections unused for `idleTimeout` (or closed by the
    /// upstream) are closed, and the sweep is scheduled for the next one to expire.
    mutating func sweepFired(now: NIODeadline) -> Action {
        sweepAt = nil
        var action = Action.none
        guard case .running = phase else { return action }
        idle.removeAll { entry in
            guard entry.since + idleTimeout <= now || !entry.connection.isActive else { return false }
            open[entry.connection.id] = nil
            cap.release()
            action.close.append(entry.connection)
            return true
        }
        if !action.close.isEmpty {
            serveWaiters(now: now, into: &action)
            slotsFreed(into: &action)
        }
        // `idle` is in order of last use: the first one expires first.
        if let oldest = idle.first {
            let at = oldest.since + idleTimeout
            sweepAt = at
            action.sweep = .schedule(at)
        }
        return action
    }

    /// Another loop freed a slot of the cap while this loop's signal was up.
    mutating func slotMayBeFree(now: NIODeadline) -> Action {
        var action = Action.none
        guard case .running = phase else { return action }
        serveWaiters(now: now, into: &action)
        return action
    }

    /// Another loop has requests waiting at the cap: unless requests wait here too, the least
    /// recently used idle connection here is closed so that its slot goes there. `false`: none.
    mutating func closeIdleForOtherLoop() -> (Bool, Action) {
        var action = Action.none
        guard case .running = phase, waiters.isEmpty, !idle.isEmpty else { return (false, action) }
        let entry = idle.removeFirst()
        open[entry.connection.id] = nil
        cap.release()
        action.close.append(entry.connection)
        slotsFreed(into: &action)
        return (true, action)
    }

    /// A reload replaced the pool: idle connections close and waiters fail now (they have had
    /// their request timeout), new leases are refused, and each leased connection closes when
    /// its exchange is done — a response stream in flight is never cut by a reload.
    mutating func retire() -> Action {
        guard case .running = phase else { return .none }
        phase = .retiring
        var action = Action.none
        for entry in idle {
            open[entry.connection.id] = nil
            cap.release()
            action.close.append(entry.connection)
        }
        idle = []
        failWaitersAndStopTimers(into: &action)
        return action
    }

    /// Closes every open connection (leased ones too: their requests fail) and fails every
    /// waiter; connections still being opened are closed when they come (`connected`).
    mutating func shutdown() -> Action {
        if case .shutDown = phase { return .none }
        phase = .shutDown
        var action = Action.none
        action.close = Array(open.values)
        for _ in open { cap.release() }
        open = [:]
        idle = []
        failWaitersAndStopTimers(into: &action)
        if !action.close.isEmpty { slotsFreed(into: &action) }
        return action
    }

    // MARK: Helpers

    /// Retirement and shutdown: every waiter fails, both timers stop.
    private mutating func failWaitersAndStopTimers(into action: inout Action) {
        action.handovers = waiters.map { .fail($0.waiter, Self.shutDownError) }
        waiters.removeAll()
        lowerSignal()
        if sweepAt != nil { action.sweep = .cancel }
        if waiterTimerAt != nil { action.waiterTimer = .cancel }
        sweepAt = nil
        waiterTimerAt = nil
    }

    /// The most recently used idle connection still usable; stale ones are closed.
    private mutating func popUsableIdle(now: NIODeadline, into action: inout Action) -> Connection? {
        while let candidate = idle.popLast() {
            if candidate.connection.isActive && candidate.since + idleTimeout > now {
                return candidate.connection
            }
            open[candidate.connection.id] = nil
            cap.release()
            action.close.append(candidate.connection)
        }
        return nil
    }

    /// Serves waiters in order while there is an idle connection or a free slot.
    private mutating func serveWaiters(now: NIODeadline, into action: inout Action) {
        guard !waiters.isEmpty else { return }
        while !waiters.isEmpty {
            if let connection = popUsableIdle(now: now, into: &action) {
                if let first = waiters.popFirst() { action.handovers.append(.use(first.waiter, connection)) }
            } else if takeSlot() {
                connecting += 1
                if let first = waiters.popFirst() { action.handovers.append(.connect(first.waiter)) }
            } else {
                break
            }
        }
        if waiters.isEmpty { lowerSignal() }
    }

    /// Whether a request on another loop waits for a slot. Below the cap that is one relaxed
    /// load of the cap's count (so per request it reads, never writes, a shared word); at the
    /// cap, the other loops' signals too.
    private func otherLoopsWait() -> Bool {
        guard signals.count > 1, cap.current >= limit else { return false }
        return signals.indices.contains { $0 != index && signals[$0].isWaiting }
    }

    private func takeSlot() -> Bool {
        cap.tryAcquire(limit: limit)
    }

    /// After slots were given back: the fence pairs with the one in `enqueue`, so that the
    /// pool, reading the other loops' signals next, cannot miss a loop that found the cap full.
    private func slotsFreed(into action: inout Action) {
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        action.slotFreed = true
    }

    private func lowerSignal() {
        if signal.value.load(ordering: .relaxed) { signal.value.store(false, ordering: .relaxed) }
    }
}
