import MicroHTTPD
import PorticoTesting
import Testing

@Suite("MicroHTTPD lifecycle")
struct LifecycleTests {
    @Test("created → running → draining (still serving, asking clients to close) → stopped; each step taken once")
    func forwardOnly() async throws {
        let server = HTTPServer(configuration: ServerConfiguration(), handler: echo)
        #expect(server.lifecycle == .created)
        #expect(!server.beginDraining(), "a server that never ran does not drain")
        try server.start()
        #expect(server.lifecycle == .running)
        #expect(throws: MicroHTTPDError.alreadyStarted) { try server.start() }

        let connection = try RawHTTPConnection(port: Int(server.port))
        try await connection.send("GET /before HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try await connection.readResponse()?.header("connection") == nil)

        #expect(server.beginDraining())
        #expect(!server.beginDraining())
        #expect(server.lifecycle == .draining)
        try await connection.send("GET /draining HTTP/1.1\r\nHost: x\r\n\r\n")
        let draining = try #require(try await connection.readResponse())
        #expect(draining.status == 200)
        #expect(draining.header("connection")?.lowercased() == "close")
        // Still accepting while draining.
        let fresh = try RawHTTPConnection(port: Int(server.port))
        try await fresh.send("GET /new HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try await fresh.readResponse()?.status == 200)

        await server.stop(grace: .seconds(1))
        #expect(server.lifecycle == .stopped)
        await server.stop(grace: .seconds(1))
        #expect(server.lifecycle == .stopped)
        #expect(!server.beginDraining())
    }
}
