import LockAudit
import Testing
@testable import Portico

/// `HTTP2PoolStateMachine` without sockets: connections are names, waiters strings.
@Suite("HTTP/2 pool state machine")
struct HTTP2PoolStateMachineTests {
    typealias Machine = HTTP2PoolStateMachine<String, String>

    static func machine(perLoop: Int = 1, streams: Int = 3, maxConnections: Int = 8,
                        cap: SharedCap = SharedCap(name: "test.max_connections")) -> Machine {
        Machine(cap: cap, maxConnections: maxConnections, connectionsPerLoop: perLoop, maxStreams: streams)
    }

    /// Leases with a new connection to open, and opens it.
    static func open(_ machine: inout Machine, _ name: String, peerLimit: Int? = nil) throws -> Machine.EntryID {
        guard case .connect(let id) = machine.lease() else {
            Issue.record("expected a connection to open")
            throw CancellationError()
        }
        let action = machine.connected(id, connection: name, peerLimit: peerLimit)
        #expect(action.handovers.isEmpty && action.close.isEmpty)
        return id
    }

    static func used(_ handovers: [Machine.Handover]) -> [String] {
        handovers.map {
            switch $0 {
            case .use(let waiter, let connection, _): "\(waiter)→\(connection)"
            case .connect(let waiter, _): "\(waiter)→connect"
            case .fail(let waiter, let error): "\(waiter)→\(error)"
            }
        }
    }

    @Test("requests share a connection up to the smaller of both limits, then wait; a stream's end serves the next")
    func multiplexes() throws {
        var machine = Self.machine(streams: 3)
        let c = try Self.open(&machine, "c1", peerLimit: 2)
        #expect(machine.limit(of: c) == 2)
        guard case .use("c1", c) = machine.lease() else { Issue.record("second stream on c1"); return }
        #expect(machine.streams(on: c) == 2)
        guard case .wait = machine.lease() else { Issue.record("full, and one connection per loop: wait"); return }
        let id = machine.makeWaiterID()
        #expect(machine.enqueue("w1", id: id).handovers.isEmpty)
        #expect(Self.used(machine.streamClosed(c).handovers) == ["w1→c1"])
        #expect(machine.streams(on: c) == 2)
        #expect(machine.connectionCount == 1)
        // A SETTINGS that raises the peer's limit makes room, up to ours.
        #expect(machine.enqueue("w2", id: machine.makeWaiterID()).handovers.isEmpty)
        #expect(Self.used(machine.settingsChanged(c, peerLimit: 100).handovers) == ["w2→c1"])
        #expect(machine.limit(of: c) == 3)
    }

    @Test("a TLS connection ready before the peer's SETTINGS: their limit, heard first, is not overwritten by the assumed one; the first SETTINGS without a limit lifts it to ours")
    func settingsBeforeConnected() throws {
        var machine = Self.machine(streams: 8)
        // The loop tells the SETTINGS (a limit of 2) before the opener's `connected` (assuming 100).
        guard case .connect(let id) = machine.lease() else { Issue.record("a connection opens"); return }
        _ = machine.settingsChanged(id, peerLimit: 2)
        _ = machine.connected(id, connection: "c1", peerLimit: HTTP2Connection.assumedPeerStreams)
        #expect(machine.limit(of: id) == 2)
        guard case .use("c1", _) = machine.lease() else { Issue.record("second stream"); return }
        guard case .wait = machine.lease() else { Issue.record("the peer's 2, not the assumed 100"); return }

        // Ready with the assumed limit, then SETTINGS that set none: no limit but ours.
        var other = Self.machine(streams: 150)
        let c = try Self.open(&other, "c2", peerLimit: HTTP2Connection.assumedPeerStreams)
        #expect(other.limit(of: c) == 100)
        _ = other.settingsChanged(c, peerLimit: nil)
        #expect(other.limit(of: c) == 150)
    }

    @Test("a second connection opens only when every one is full, within connections_per_loop and max_connections")
    func opensWhenFull() throws {
        let cap = SharedCap(name: "test.h2.cap")
        var machine = Self.machine(perLoop: 2, streams: 1, maxConnections: 2, cap: cap)
        _ = try Self.open(&machine, "c1")
        _ = try Self.open(&machine, "c2")
        #expect(cap.current == 2)
        guard case .wait = machine.lease() else { Issue.record("both full: wait"); return }
        var other = Self.machine(perLoop: 2, streams: 1, maxConnections: 2, cap: cap)
        guard case .wait = other.lease() else { Issue.record("another loop at the cap waits too"); return }
    }

    @Test("requests beyond a connecting connection's room open the next; a failed connect fails the waiters nothing else can carry")
    func connecting() {
        var machine = Self.machine(perLoop: 2, streams: 2)
        guard case .connect(let first) = machine.lease() else { Issue.record("open"); return }
        // The connection will carry one more: the next waits for it, the one after opens another.
        guard case .wait = machine.lease() else { Issue.record("wait for the connecting one"); return }
        #expect(machine.enqueue("w1", id: machine.makeWaiterID()).handovers.isEmpty)
        guard case .connect(let second) = machine.lease() else { Issue.record("open a second"); return }
        #expect(machine.connectionCount == 2)
        #expect(machine.connectFailed(first, error: UpstreamError.connectFailed("refused")).handovers.isEmpty,
                "the second may still carry w1")
        let failed = machine.connectFailed(second, error: UpstreamError.connectFailed("refused"))
        #expect(Self.used(failed.handovers) == [#"w1→connectFailed("refused")"#])
        #expect(machine.connectionCount == 0)
        #expect(machine.cap.current == 0)
    }

    @Test("with max_concurrent_streams above 100, a connecting connection counts for the 100 streams it will start with: a burst opens the next at once")
    func burstPastTheAssumedLimit() throws {
        var machine = Self.machine(perLoop: 3, streams: 250)
        guard case .connect(let first) = machine.lease() else { Issue.record("open"); return }
        for n in 1...99 {
            guard case .wait = machine.lease() else { Issue.record("request \(n) waits for the connecting one"); return }
            #expect(machine.enqueue("w\(n)", id: machine.makeWaiterID()).handovers.isEmpty)
        }
        guard case .connect = machine.lease() else { Issue.record("the 101st opens a second connection, not the 251st"); return }
        #expect(machine.connectionCount == 2)
        // Ready with the assumed 100: the 99 waiting take the rest of it.
        let ready = machine.connected(first, connection: "c1", peerLimit: 100)
        #expect(ready.handovers.count == 99)
        #expect(machine.streams(on: first) == 100)
        // Its SETTINGS then raise the limit to ours.
        #expect(machine.settingsChanged(first, peerLimit: nil).handovers.isEmpty)
        #expect(machine.limit(of: first) == 250)
    }

    @Test("GOAWAY drains: no new streams there, a successor opens at once, the drained connection closes at its last stream")
    func goAway() throws {
        let cap = SharedCap(name: "test.h2.goaway")
        var machine = Self.machine(perLoop: 1, streams: 10, cap: cap)
        let old = try Self.open(&machine, "old")
        #expect(machine.goAway(old).close.isEmpty, "its stream is still open")
        guard case .connect(let new) = machine.lease() else { Issue.record("a successor opens"); return }
        _ = machine.connected(new, connection: "new", peerLimit: nil)
        #expect(cap.current == 2)
        #expect(machine.streamClosed(old).close == ["old"])
        #expect(cap.current == 1)
        guard case .use("new", _) = machine.lease() else { Issue.record("on the new one"); return }
    }

    @Test("a refused stream is sent again elsewhere: the refusing connection is avoided when another has room")
    func avoidsRefusing() throws {
        var machine = Self.machine(perLoop: 2, streams: 5)
        let c1 = try Self.open(&machine, "c1")
        guard case .connect(let c2) = machine.lease(avoiding: c1) else { Issue.record("a new one, not c1"); return }
        _ = machine.connected(c2, connection: "c2", peerLimit: nil)
        guard case .use("c2", _) = machine.lease(avoiding: c1) else { Issue.record("c2, not c1"); return }
        guard case .use("c1", _) = machine.lease() else { Issue.record("c1 for the others"); return }
    }

    @Test("shutdown fails waiters and closes connections; one still connecting closes when it arrives")
    func shutdown() throws {
        let cap = SharedCap(name: "test.h2.shutdown")
        var machine = Self.machine(perLoop: 2, streams: 1, cap: cap)
        _ = try Self.open(&machine, "c1")
        guard case .connect(let pending) = machine.lease() else { Issue.record("open"); return }
        guard case .wait = machine.lease() else { Issue.record("wait"); return }
        _ = machine.enqueue("w", id: machine.makeWaiterID())
        let action = machine.shutdown()
        #expect(action.close == ["c1"])
        #expect(Self.used(action.handovers).count == 1)
        #expect(machine.connected(pending, connection: "late", peerLimit: nil).close == ["late"])
        #expect(cap.current == 0)
        guard case .shutDown = machine.lease() else { Issue.record("shut down"); return }
    }

    @Test("retire closes idle connections, tells busy ones GOAWAY and closes them at their last stream's end")
    func retire() throws {
        let cap = SharedCap(name: "test.h2.retire")
        var machine = Self.machine(perLoop: 2, streams: 1, cap: cap)
        // Each connection opens for a request, which takes its one stream; "idle"'s ends.
        let idle = try Self.open(&machine, "idle")
        let stream = try Self.open(&machine, "busy")
        _ = machine.streamClosed(idle)
        let action = machine.retire()
        #expect(action.close == ["idle"])
        #expect(action.goAway == ["busy"], "the busy connection hears GOAWAY and stays open")
        guard case .shutDown = machine.lease() else { Issue.record("no lease after retire"); return }
        #expect(machine.streamClosed(stream).close == ["busy"], "closed at its last stream's end")
        #expect(cap.current == 0)
    }

    @Test("below the loops' wish, max_connections is split so every share that holds connections can open its first")
    func sharesBelowTheCap() {
        // Room for every loop: unchanged.
        #expect(HTTP2ConnectionPool.parts(loops: 2, maxConnections: 64, connectionsPerLoop: 1) == (2, 1))
        #expect(HTTP2ConnectionPool.parts(loops: 4, maxConnections: 8, connectionsPerLoop: 2) == (4, 2))
        // One connection, two loops: one share holds it, the other loop's requests go there.
        #expect(HTTP2ConnectionPool.parts(loops: 2, maxConnections: 1, connectionsPerLoop: 1) == (1, 1))
        // Three for two loops that would open two each: one each (none can take the other's first).
        #expect(HTTP2ConnectionPool.parts(loops: 2, maxConnections: 3, connectionsPerLoop: 2) == (2, 1))
        #expect(HTTP2ConnectionPool.parts(loops: 8, maxConnections: 3, connectionsPerLoop: 1) == (3, 1))
        #expect(HTTP2ConnectionPool.parts(loops: 2, maxConnections: 5, connectionsPerLoop: 4) == (2, 2))
    }
}
