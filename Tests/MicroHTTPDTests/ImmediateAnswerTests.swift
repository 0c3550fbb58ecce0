import MicroHTTPD
import PorticoTesting
import Synchronization
import Testing

/// Handlers that answer on libmicrohttpd's thread (`.now`) beside ones that need a task (`.later`).
@Suite("MicroHTTPD answers given at once")
struct ImmediateAnswerTests {
    final class Count: Sendable {
        let value = Mutex(0)
    }

    /// `/now…` is answered at once; anything else later, by a task.
    static func answering(laterCalls: Count) -> HTTPServer.Answering {
        { request in
            if request.target.hasPrefix("/now") {
                return .now(ServerResponse(status: 200, headers: [("X-Answered", "now")],
                                           body: Array("now \(request.target)".utf8)))
            }
            return .later {
                laterCalls.value.withLock { $0 += 1 }
                return ServerResponse(status: 200, headers: [("X-Answered", "later")],
                                      body: Array("later \(request.target)".utf8))
            }
        }
    }

    @Test("answers given at once and answers from tasks interleave on one keep-alive connection, in order")
    func interleaved() async throws {
        let laterCalls = Count()
        let server = HTTPServer(configuration: ServerConfiguration(), answering: Self.answering(laterCalls: laterCalls))
        let port = Int(try server.start())
        let connection = try RawHTTPConnection(port: port)
        let targets = ["/now/1", "/later/2", "/now/3", "/now/4", "/later/5", "/now/6"]
        for target in targets {
            try await connection.send("GET \(target) HTTP/1.1\r\nHost: x\r\n\r\n")
            let response = try #require(try await connection.readResponse())
            let kind = target.hasPrefix("/now") ? "now" : "later"
            #expect(response.status == 200)
            #expect(response.header("X-Answered") == kind)
            #expect(response.bodyText == "\(kind) \(target)")
            #expect(response.header("Connection")?.lowercased() != "close")
        }
        #expect(laterCalls.value.withLock { $0 } == 2)
        // An answer given at once never counts as in flight.
        #expect(server.inFlightRequests == 0)
        await server.stop(grace: .seconds(5))
    }

    @Test("pipelined requests of both kinds get their answers in request order")
    func pipelined() async throws {
        let laterCalls = Count()
        let server = HTTPServer(configuration: ServerConfiguration(), answering: Self.answering(laterCalls: laterCalls))
        let port = Int(try server.start())
        let connection = try RawHTTPConnection(port: port)
        let targets = (0..<20).map { $0 % 3 == 0 ? "/later/\($0)" : "/now/\($0)" }
        try await connection.send(targets.map { "GET \($0) HTTP/1.1\r\nHost: x\r\n\r\n" }.joined())
        for target in targets {
            let response = try #require(try await connection.readResponse())
            #expect(response.bodyText.hasSuffix(" \(target)"))
        }
        await server.stop(grace: .seconds(5))
    }

    @Test("HEAD answered at once has the head of GET and no body")
    func head() async throws {
        let server = HTTPServer(configuration: ServerConfiguration()) { (_: ServerRequest) -> HTTPServer.Answer in
            .now(ServerResponse(status: 200, headers: [("Content-Type", "text/plain")], body: Array("twelve bytes".utf8),
                                headContentLength: 12))
        }
        let port = Int(try server.start())
        let connection = try RawHTTPConnection(port: port)
        try await connection.send("HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        let response = try #require(try await connection.readResponse(forHead: true))
        #expect(response.status == 200)
        #expect(response.header("Content-Length") == "12")
        #expect(response.body.isEmpty)
        // The connection is still in step: a body would have been read as the next response.
        try await connection.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try await connection.readResponse()?.bodyText == "twelve bytes")
        await server.stop(grace: .seconds(5))
    }

    @Test("while stopping, answers given at once ask the client to close its connection")
    func draining() async throws {
        let release = AsyncGate()
        let server = HTTPServer(configuration: ServerConfiguration()) { (request: ServerRequest) -> HTTPServer.Answer in
            if request.target == "/now" { return .now(ServerResponse(status: 200, body: Array("now".utf8))) }
            return .later {
                await release.wait()
                return ServerResponse(status: 200)
            }
        }
        let port = Int(try server.start())
        let held = try RawHTTPConnection(port: port)
        try await held.send("GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
        let open = try RawHTTPConnection(port: port)
        try await open.send("GET /now HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try await open.readResponse()?.status == 200)
        #expect(await eventually { server.inFlightRequests == 1 })
        let stopping = Task { await server.stop(grace: .seconds(60)) }
        // Stopping: the held request keeps the server serving open connections, with `Connection: close`.
        var closed = false
        let deadline = ContinuousClock.now.advanced(by: .seconds(30))
        while !closed, ContinuousClock.now < deadline {
            try await open.send("GET /now HTTP/1.1\r\nHost: x\r\n\r\n")
            let response = try #require(try await open.readResponse())
            #expect(response.status == 200)
            closed = response.header("Connection")?.lowercased() == "close"
        }
        #expect(closed)
        release.open()
        #expect(try await held.readResponse()?.status == 200)
        await stopping.value
    }
}
