import Foundation
import PorticoTesting
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("Test servers")
struct LoopbackServerTests {
    @Test("a test upstream shut down while clients keep connecting closes every connection and never traps")
    func shutdownWhileConnecting() async throws {
        var connectedInAll = 0
        for round in 0..<20 {
            let upstream = TestUpstream()
            try await upstream.start()
            let port = UInt16(upstream.port)
            // Raw connects from a thread of its own, racing the shutdown below; each socket that
            // connected is kept open, to see whether the server closes its end.
            let connector = Connector(port: port, attempts: 50)
            Thread { connector.run() }.start()
            // The first connect lands before the shutdown begins (on a busy machine the thread
            // might otherwise start after it, and the round would prove nothing); the rest race it.
            try await Eventually.wait(timeout: .seconds(30), "a first connection") { !connector.connected.isEmpty || connector.finished }
            await upstream.shutdown()
            try await Eventually.wait(timeout: .seconds(30), "the connector thread") { connector.finished }
            let sockets = connector.connected
            connectedInAll += sockets.count
            // Closed by the server: end of stream or a reset (a connection still in the listener's
            // backlog when it closed). One deadline for the whole round.
            let deadline = ContinuousClock.now.advanced(by: .seconds(10))
            var stillOpen = 0
            for fd in sockets {
                if !Self.closedByPeer(fd, before: deadline) { stillOpen += 1 }
                close(fd)
            }
            #expect(stillOpen == 0, "round \(round): \(stillOpen) of \(sockets.count) connections left open after shutdown")
            #expect(upstream.connections.open == 0, "round \(round): the server still counts open connections")
        }
        // Some connects must have won the race, or the test proved nothing about closing them.
        #expect(connectedInAll > 0)
    }

    /// Whether the peer closed `fd` (end of stream or reset) before `deadline`.
    static func closedByPeer(_ fd: Int32, before deadline: ContinuousClock.Instant) -> Bool {
        while true {
            let left = ContinuousClock.now.duration(to: deadline)
            guard left > .zero else { return false }
            var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&entry, 1, Int32(left.components.seconds * 1000 + 1))
            if ready < 0, errno == EINTR { continue }
            guard ready > 0 else { return false }
            var byte: UInt8 = 0
            let read = recv(fd, &byte, 1, 0)
            if read == 0 { return true }
            if read < 0 { return errno == ECONNRESET || errno == EPIPE }
            // A byte from a server that was never sent a request: not a close; keep reading.
        }
    }
}

/// Connects `attempts` times to a port on 127.0.0.1 from a plain thread, keeping the sockets that
/// connected.
private final class Connector: Sendable {
    private let port: UInt16
    private let attempts: Int
    private let state = Mutex<(sockets: [Int32], finished: Bool)>(([], false))

    init(port: UInt16, attempts: Int) {
        self.port = port
        self.attempts = attempts
    }

    var finished: Bool { state.withLock { $0.finished } }
    var connected: [Int32] { state.withLock { $0.sockets } }

    func run() {
        for _ in 0..<attempts {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            guard fd >= 0 else { continue }
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            if result == 0 {
                state.withLock { $0.sockets.append(fd) }
            } else {
                close(fd)
            }
        }
        state.withLock { $0.finished = true }
    }
}
