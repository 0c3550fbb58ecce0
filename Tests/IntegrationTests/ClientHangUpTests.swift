import Foundation
import Logging
import MetricsTestKit
import Portico
import PorticoTesting
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

private struct UpstreamFailure: Error {
    var description: String
}

/// An upstream that reads each request head and never answers, and counts the connections the
/// gateway closes (it reads end of input or an error).
private final class SilentUpstream: Sendable {
    let port: Int
    private let listener: Int32
    private let state = Mutex<(received: Int, closed: Int, connections: [Int32])>((0, 0, []))

    var received: Int { state.withLock { $0.received } }
    var closed: Int { state.withLock { $0.closed } }

    init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        listener = fd
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        inet_pton(AF_INET, "127.0.0.1", &address.sin_addr)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bind(fd, address, length) == 0 && listen(fd, 16) == 0
                    && getsockname(fd, address, &length) == 0
            }
        }
        guard bound else { throw UpstreamFailure(description: "upstream: \(String(cString: strerror(errno)))") }
        port = Int(UInt16(bigEndian: address.sin_port))
        let thread = Thread { [self] in acceptLoop() }
        thread.stackSize = 256 * 1024
        thread.start()
    }

    private func acceptLoop() {
        while true {
            let connection = accept(listener, nil, nil)
            if connection < 0 {
                if errno == EINTR { continue }
                return
            }
            state.withLock { $0.connections.append(connection) }
            let thread = Thread { [self] in serve(connection) }
            thread.stackSize = 256 * 1024
            thread.start()
        }
    }

    private func serve(_ connection: Int32) {
        var head: [UInt8] = []
        var counted = false
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(connection, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            if !counted {
                head += chunk[0..<n]
                if head.count >= 4 && head.indices.dropLast(3).contains(where: { head[$0..<$0 + 4].elementsEqual([13, 10, 13, 10]) }) {
                    counted = true
                    state.withLock { $0.received += 1 }
                }
            }
        }
        state.withLock { $0.closed += 1 }
    }

    /// Ends every thread: the listener and the connections still open are shut down.
    func stop() {
        let connections = state.withLock { $0.connections }
        _ = shutdown(listener, Int32(SHUT_RDWR))
        for connection in connections { _ = shutdown(connection, Int32(SHUT_RDWR)) }
    }
}

@Suite("A client leaving mid-request through the gateway")
struct ClientHangUpTests {
    @Test("the upstream request is cancelled: its connection closes, nothing stays in flight",
          arguments: UpstreamConfig.Transport.allCases, [false, true])
    func upstreamCancelled(transport: UpstreamConfig.Transport, reset: Bool) async throws {
        let upstream = try SilentUpstream()
        defer { upstream.stop() }
        var config = PorticoConfig()
        var settings = UpstreamConfig(name: "up", url: URL(string: "http://127.0.0.1:\(upstream.port)/base")!)
        settings.transport = transport
        // Nothing but the hang-up can end the exchange within the waits below: the upstream timeout
        // and the request's deadline are ten minutes away. So the waits can be generous (a loaded
        // machine may take seconds to get round to a close) and still tell the hang-up at work.
        settings.timeout = .seconds(600)
        config.upstreams = ["up": settings]
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api"), upstream: "up", stripPrefix: true)]
        config.listen.address = "127.0.0.1"
        config.listen.port = 0
        config.listen.requestTimeout = .seconds(600)
        let metrics = TestMetrics()
        let gateway = try GatewayServer(config: config, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
                                        metrics: GatewayMetrics(factory: metrics))
        let port = Int(try gateway.start())
        let inFlight = try metrics.expectMeter("portico_in_flight_requests")
        let client = try RawHTTPConnection(port: port)
        try await client.send("GET /api/slow HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        try await Eventually.wait(timeout: .seconds(120), "the upstream to receive the request") { upstream.received == 1 }
        #expect(gateway.inFlightRequests == 1)
        #expect(inFlight.lastValue == 1)
        if reset { client.reset() } else { client.shutdownWrite() }
        try await Eventually.wait(timeout: .seconds(120), "the upstream connection to close (\(transport))") { upstream.closed == 1 }
        try await Eventually.wait(timeout: .seconds(120), "nothing in flight") { gateway.inFlightRequests == 0 }
        // The handler itself has finished: the gateway's gauge is back to zero.
        try await Eventually.wait(timeout: .seconds(120), "the in-flight gauge at 0") { inFlight.lastValue == 0 }
        await gateway.shutdown(drainDelay: .zero, grace: .seconds(5))
    }
}
