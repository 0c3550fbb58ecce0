import LockAudit

/// The logic of one event loop's share of an `HTTP2ConnectionPool`, as a value: transitions
/// return what to do, the pool does it. No sockets, no clock, no threads; generic over the
/// connection and the waiter, so tests drive it with plain values.
///
/// A share keeps a few connections to one endpoint, each carrying streams up to its `limit`:
/// the smaller of ours (`max_concurrent_streams`) and the peer's `SETTINGS_MAX_CONCURRENT_STREAMS`.
/// A request takes a stream on the first connection with room; a new connection opens only when
/// every one is full (or still connecting with more requests waiting than it will carry), within
/// `connections_per_loop` here and the upstream's `max_connections` (`cap`, shared with the other
/// loops, taken per connection, never per request). Otherwise the request waits, first come
/// first served, for a stream to end, a SETTINGS that raises a limit, or a connection to open.
///
/// After `GOAWAY` a connection is `draining`: it takes no new stream, stops counting towards
/// `connections_per_loop` (so a successor can open at once), and closes when its last stream
/// ends. A connection that fails to open fails the requests waiting when no other connection
/// could still carry them (a refused port answers them all at once, not at their deadlines).
struct HTTP2PoolStateMachine<Connection, Waiter> {
    struct EntryID: Hashable, Sendable {
        fileprivate(set) var raw: Int
    }

    struct WaiterID: Hashable, Sendable {
        fileprivate var raw: Int
    }

    /// What a request that asks for a stream does next.
    enum Lease {
        /// Open a stream on this connection (then `streamClosed` when it ends).
        case use(Connection, EntryID)
        /// A connection is to be opened for it (then `connected` or `connectFailed`); it has the
        /// first stream on it.
        case connect(EntryID)
        /// Every connection is full and no other may open: wait (`enqueue`).
        case wait
        case shutDown
    }

    /// What a waiting request gets.
    enum Handover {
        case use(Waiter, Connection, EntryID)
        case connect(Waiter, EntryID)
        case fail(Waiter, any Error)
    }

    /// What a transition asks the pool to do.
    struct Action {
        var handovers: [Handover] = []
        /// Connections to close: drained after GOAWAY, or all at shutdown.
        var close: [Connection] = []
        /// Connections to tell `GOAWAY` and leave open for their streams in flight (retired).
        var goAway: [Connection] = []

        static var none: Action { Action() }
    }

    private struct Entry {
        var id: EntryID
        /// `nil` while connecting.
        var connection: Connection?
        var open = 0
        var limit: Int
        /// The peer's SETTINGS came while it was connecting (over TLS the connection is ready
        /// before them, and its loop can tell them before the opener tells `connected`).
        var limitHeard = false
        var draining = false

        var hasRoom: Bool { connection != nil && !draining && open < limit }
    }

    private struct WaiterEntry {
        var id: WaiterID
        var waiter: Waiter
    }

    let cap: SharedCap
    /// `max_connections`, for the whole upstream.
    let maxConnections: Int
    let connectionsPerLoop: Int
    /// `max_concurrent_streams`: ours.
    let maxStreams: Int
    /// The peer's stream limit a connection is counted on while it connects, before its SETTINGS
    /// say (`HTTP2Connection.assumedPeerStreams`: over TLS it starts with that many).
    let assumedPeerStreams: Int
    private var entries: [Entry] = []
    private var waiters: [WaiterEntry] = []
    private var nextID = 0
    private(set) var isShutDown = false

    init(cap: SharedCap, maxConnections: Int, connectionsPerLoop: Int, maxStreams: Int,
         assumedPeerStreams: Int = HTTP2Connection.assumedPeerStreams) {
        self.cap = cap
        self.maxConnections = maxConnections
        self.connectionsPerLoop = connectionsPerLoop
        self.maxStreams = maxStreams
        self.assumedPeerStreams = assumedPeerStreams
    }

    static var shutDownError: UpstreamError { .connectFailed("client is shut down") }

    // MARK: For tests and reports

    var connectionCount: Int { entries.count }
    var openStreams: Int { entries.reduce(0) { $0 + $1.open } }
    var waiterCount: Int { waiters.count }
    func streams(on id: EntryID) -> Int? { entries.first { $0.id == id }?.open }
    func limit(of id: EntryID) -> Int? { entries.first { $0.id == id }?.limit }

    // MARK: Requests

    /// A stream for a request. `avoiding`: a connection that just refused it, skipped if another has room.
    mutating func lease(avoiding: EntryID? = nil) -> Lease {
        if isShutDown { return .shutDown }
        if let index = entries.firstIndex(where: { $0.hasRoom && $0.id != avoiding }) {
            entries[index].open += 1
            return .use(entries[index].connection!, entries[index].id)
        }
        if waiters.count < pendingCapacity(), avoiding == nil { return .wait }
        if let id = openConnection() { return .connect(id) }
        return .wait
    }

    mutating func makeWaiterID() -> WaiterID {
        nextID += 1
        return WaiterID(raw: nextID)
    }

    /// A request waits for a stream.
    mutating func enqueue(_ waiter: Waiter, id: WaiterID) -> Action {
        guard !isShutDown else { return Action(handovers: [.fail(waiter, Self.shutDownError)]) }
        waiters.append(WaiterEntry(id: id, waiter: waiter))
        return drain()
    }

    /// A waiter gave up (its deadline, or its task was cancelled): it is returned to be told.
    mutating func cancelWaiter(_ id: WaiterID) -> Waiter? {
        guard let index = waiters.firstIndex(where: { $0.id == id }) else { return nil }
        return waiters.remove(at: index).waiter
    }

    // MARK: Connections' events

    /// The connection opened for `id` is ready; `peerLimit` the peer's stream limit to start
    /// with, unless its SETTINGS were heard first. Its opener has its first stream.
    mutating func connected(_ id: EntryID, connection: Connection, peerLimit: Int?) -> Action {
        guard let index = entries.firstIndex(where: { $0.id == id }) else { return Action(close: [connection]) }
        if isShutDown {
            entries.remove(at: index)
            cap.release()
            return Action(close: [connection])
        }
        entries[index].connection = connection
        if !entries[index].limitHeard { entries[index].limit = Self.limit(ours: maxStreams, peer: peerLimit) }
        entries[index].open = 1
        return drain()
    }

    /// The connection for `id` did not open: its slot goes back; waiters that nothing else can
    /// carry fail with `error`.
    mutating func connectFailed(_ id: EntryID, error: any Error) -> Action {
        guard let index = entries.firstIndex(where: { $0.id == id }) else { return .none }
        entries.remove(at: index)
        cap.release()
        guard entries.contains(where: { $0.connection == nil || $0.hasRoom || ($0.open > 0 && !$0.draining) }) else {
            let failed = waiters.map { Handover.fail($0.waiter, error) }
            waiters.removeAll()
            return Action(handovers: failed)
        }
        return drain()
    }

    /// A stream on `id` ended.
    mutating func streamClosed(_ id: EntryID) -> Action {
        guard let index = entries.firstIndex(where: { $0.id == id }) else { return .none }
        entries[index].open -= 1
        if entries[index].draining && entries[index].open == 0 {
            let entry = entries.remove(at: index)
            cap.release()
            var action = drain()
            if let connection = entry.connection { action.close.append(connection) }
            return action
        }
        return drain()
    }

    /// The peer's SETTINGS changed its stream limit (`nil`: it has none).
    mutating func settingsChanged(_ id: EntryID, peerLimit: Int?) -> Action {
        guard let index = entries.firstIndex(where: { $0.id == id }) else { return .none }
        entries[index].limit = Self.limit(ours: maxStreams, peer: peerLimit)
        entries[index].limitHeard = true
        return drain()
    }

    /// GOAWAY on `id`: no new streams; it closes once its streams have ended.
    mutating func goAway(_ id: EntryID) -> Action {
        guard let index = entries.firstIndex(where: { $0.id == id }), !entries[index].draining else { return .none }
        entries[index].draining = true
        if entries[index].open == 0 {
            let entry = entries.remove(at: index)
            cap.release()
            var action = drain()
            if let connection = entry.connection { action.close.append(connection) }
            return action
        }
        return drain()
    }

    /// The connection for `id` closed (its channel's close future): its slot goes back.
    mutating func closed(_ id: EntryID) -> Action {
        guard let index = entries.firstIndex(where: { $0.id == id }), entries[index].connection != nil else { return .none }
        entries.remove(at: index)
        cap.release()
        return drain()
    }

    /// Closes every connection and fails waiting requests; later leases fail.
    mutating func shutdown() -> Action {
        isShutDown = true
        var action = Action(handovers: waiters.map { .fail($0.waiter, Self.shutDownError) })
        waiters.removeAll()
        for entry in entries where entry.connection != nil {
            action.close.append(entry.connection!)
            cap.release()
        }
        // Connecting entries give their slots back as they finish (`connected` closes them).
        entries.removeAll { $0.connection != nil }
        return action
    }

    /// A reload replaced the pool: later leases fail, idle connections close, busy ones are told
    /// GOAWAY and drain (closed at their last stream's end).
    mutating func retire() -> Action {
        isShutDown = true
        var action = Action(handovers: waiters.map { .fail($0.waiter, Self.shutDownError) })
        waiters.removeAll()
        for index in entries.indices.reversed() where entries[index].connection != nil {
            entries[index].draining = true
            if entries[index].open == 0 {
                action.close.append(entries.remove(at: index).connection!)
                cap.release()
            } else {
                action.goAway.append(entries[index].connection!)
            }
        }
        return action
    }

    // MARK: Inside

    static func limit(ours: Int, peer: Int?) -> Int {
        max(0, min(ours, peer ?? ours))
    }

    /// Streams the connections still connecting will carry beyond their openers' own: their
    /// limit, the assumed one until SETTINGS heard early say otherwise. (Counted at ours, a burst
    /// over 100 streams waited for the first connection before it opened the next.)
    private func pendingCapacity() -> Int {
        entries.reduce(0) { $0 + ($1.connection == nil ? max(0, $1.limit - 1) : 0) }
    }

    /// Takes a slot for a new connection if this loop and the upstream allow one.
    private mutating func openConnection() -> EntryID? {
        guard entries.count(where: { !$0.draining }) < connectionsPerLoop, cap.tryAcquire(limit: maxConnections) else {
            return nil
        }
        nextID += 1
        let id = EntryID(raw: nextID)
        entries.append(Entry(id: id, connection: nil, limit: Self.limit(ours: maxStreams, peer: assumedPeerStreams)))
        return id
    }

    /// Hands streams (or new connections) to waiters, first come first served, while there is room.
    private mutating func drain() -> Action {
        var action = Action.none
        while !waiters.isEmpty {
            if let index = entries.firstIndex(where: \.hasRoom) {
                entries[index].open += 1
                let waiter = waiters.removeFirst().waiter
                action.handovers.append(.use(waiter, entries[index].connection!, entries[index].id))
            } else if waiters.count > pendingCapacity(), let id = openConnection() {
                action.handovers.append(.connect(waiters.removeFirst().waiter, id))
            } else {
                break
            }
        }
        return action
    }
}
