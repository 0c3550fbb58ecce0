import MicroHTTPD
import PorticoTesting
import Synchronization
import Testing

/// How connections reach libmicrohttpd's threads, and how response bodies reach libmicrohttpd.
@Suite("MicroHTTPD accepting and shared bodies")
struct AcceptingTests {
    @Test("connections opened together are dealt to the threads in turn, not taken by whichever thread wakes first")
    func dealtInTurn() async throws {
        var configuration = ServerConfiguration()
        configuration.threads = 3
        // All nine are opened before the first request is sent: on a loaded machine the last
        // may wait longer than the default head timeout (10 s), which would close it unanswered.
        configuration.headerTimeout = .seconds(120)
        let server = HTTPServer(configuration: configuration) { (_: ServerRequest) -> HTTPServer.Answer in
            .now(ServerResponse(status: 200, body: Array("ok".utf8)))
        }
        let port = Int(try server.start())
        let connections = try (0..<9).map { _ in try RawHTTPConnection(port: port) }
        for connection in connections {
            try await connection.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try await connection.readResponse()?.status == 200)
        }
        #expect(server.openConnectionsPerThread == [3, 3, 3])
        await server.stop(grace: .seconds(5))
        #expect(server.openConnectionsPerThread.isEmpty)
    }

    /// Bytes owned by an object, counting how many of its kind are alive.
    final class Owned: SharedBytes {
        static let alive = Mutex(0)
        let bytes: [UInt8]

        init(_ bytes: [UInt8]) {
            self.bytes = bytes
            Self.alive.withLock { $0 += 1 }
        }

        deinit { Self.alive.withLock { $0 -= 1 } }

        func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
            try bytes.withUnsafeBytes(body)
        }
    }

    @Test("a shared body is sent as it is, and libmicrohttpd lets go of its owner once the response is sent")
    func sharedBody() async throws {
        let large = (0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let server = HTTPServer(configuration: ServerConfiguration()) { (request: ServerRequest) -> HTTPServer.Answer in
            let bytes: [UInt8] = request.target == "/large" ? large : request.target == "/empty" ? [] : Array("small".utf8)
            let response = ServerResponse(status: 200, payload: .shared(Owned(bytes)))
            // Shared bodies work from a task too.
            return request.method == "POST" ? .later { response } : .now(response)
        }
        let port = Int(try server.start())
        let connection = try RawHTTPConnection(port: port)
        for (method, target, expected) in [("GET", "/small", Array("small".utf8)), ("GET", "/large", large),
                                           ("POST", "/large", large), ("GET", "/empty", [])] {
            try await connection.send("\(method) \(target) HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            let response = try #require(try await connection.readResponse())
            #expect(response.status == 200)
            #expect(response.header("Content-Length") == String(expected.count))
            if let difference = ByteDifference(response.body, expected: expected) { Issue.record("\(difference)") }
        }
        #expect(await eventually { Owned.alive.withLock { $0 } == 0 })
        await server.stop(grace: .seconds(5))
    }
}
