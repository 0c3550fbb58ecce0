import Foundation
@testable import MicroHTTPD
import PorticoTesting
import Synchronization
import Testing

/// A handler that waits until it is cancelled (or, for `/gated`, until `open`), counting.
private final class WaitingHandler: Sendable {
    private let counts = Synchronization.Mutex<(started: Int, cancelled: Int, gateOpen: Bool)>((0, 0, false))

    var started: Int { counts.withLock { $0.started } }
    var cancelled: Int { counts.withLock { $0.cancelled } }
    func open() { counts.withLock { $0.gateOpen = true } }

    var handler: HTTPServer.Handler {
        { [self] request in
            counts.withLock { $0.started += 1 }
            if request.target == "/gated" {
                while !counts.withLock({ $0.gateOpen }) && !Task.isCancelled {
                    try? await Task.sleep(for: .milliseconds(5))
                }
            } else {
                // Returns early when the task is cancelled.
                while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
            }
            if Task.isCancelled { counts.withLock { $0.cancelled += 1 } }
            return ServerResponse(status: 200, body: Array("done \(request.target)\n".utf8))
        }
    }
}

@Suite("MicroHTTPD: clients leaving while their request is suspended")
struct HangUpTests {
    @Test("a client that closes or resets its connection mid-request has its handler cancelled",
          arguments: [false, true])
    func clientLeaves(reset: Bool) async throws {
        let waiting = WaitingHandler()
        try await withServer({ $0.requestTimeout = .seconds(120) }, handler: waiting.handler) { server in
            let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(20))
            try await connection.send("GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(await eventually(timeout: .seconds(10)) { waiting.started == 1 })
            #expect(server.inFlightRequests == 1)
            if reset {
                connection.reset()
            } else {
                // What a close sends: end of input (FIN).
                connection.shutdownWrite()
                // Closed without an answer.
                #expect(try await connection.readToEnd().isEmpty)
            }
            #expect(await eventually(timeout: .seconds(10)) { waiting.cancelled == 1 })
            #expect(await eventually(timeout: .seconds(10)) { server.inFlightRequests == 0 })
            #expect(await eventually(timeout: .seconds(10)) { server.openConnections == 0 })
            #expect(server.clientHangUps == 1)
        }
    }

    @Test("clients leaving while suspended are counted in the departures summary line")
    func departuresLogged() async throws {
        let waiting = WaitingHandler()
        let lines = Synchronization.Mutex<[String]>([])
        try await withServer({ configuration in
            configuration.errorLog = { line in lines.withLock { $0.append(line) } }
        }, handler: waiting.handler) { server in
            for index in 1...3 {
                let connection = try RawHTTPConnection(port: Int(server.port))
                try await connection.send("GET /forever HTTP/1.1\r\nHost: x\r\n\r\n")
                #expect(await eventually(timeout: .seconds(10)) { waiting.started == index })
                connection.reset()
                #expect(await eventually(timeout: .seconds(10)) { waiting.cancelled == index })
            }
            #expect(await eventually(timeout: .seconds(10)) { server.openConnections == 0 })
            #expect(server.clientHangUps == 3)
            #expect(await eventually(timeout: .seconds(10)) {
                lines.withLock { $0.contains { $0.contains("clients closed or reset connections") } }
            })
        }
    }

    @Test("a pipelined request arriving while the first is suspended is no hang-up: both are answered")
    func pipelinedRequestIsNoHangUp() async throws {
        let waiting = WaitingHandler()
        try await withServer(handler: waiting.handler) { server in
            let connection = try RawHTTPConnection(port: Int(server.port))
            try await connection.send("GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(await eventually(timeout: .seconds(10)) { waiting.started == 1 })
            try await connection.send("GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
            // Loopback delivers the bytes within `send`: were readability a hang-up, it is seen now.
            #expect(server.core.shards.allSatisfy { $0.requestHangUps.departed().isEmpty })
            waiting.open()
            let first = try #require(try await connection.readResponse())
            #expect(first.status == 200)
            #expect(first.bodyText == "done /gated\n")
            // The second request's handler waits until cancelled: the client leaving cancels it.
            #expect(await eventually(timeout: .seconds(10)) { waiting.started == 2 })
            #expect(waiting.cancelled == 0)
            #expect(server.clientHangUps == 0)
            connection.reset()
            #expect(await eventually(timeout: .seconds(10)) { waiting.cancelled == 1 })
            #expect(await eventually(timeout: .seconds(10)) { server.openConnections == 0 })
        }
    }

    @Test("a handler answering as its client leaves resumes the connection once; the server stops cleanly")
    func answerRacingHangUp() async throws {
        let waiting = WaitingHandler()
        try await withServer(handler: waiting.handler) { server in
            for _ in 0..<20 {
                let connection = try RawHTTPConnection(port: Int(server.port))
                try await connection.send("GET /gated HTTP/1.1\r\nHost: x\r\n\r\n")
                waiting.open()
                connection.reset()
            }
            #expect(await eventually(timeout: .seconds(20)) { server.inFlightRequests == 0 })
            #expect(await eventually(timeout: .seconds(20)) { server.openConnections == 0 })
        }
    }
}
