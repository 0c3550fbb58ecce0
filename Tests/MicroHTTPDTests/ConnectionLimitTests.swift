import MicroHTTPD
import PorticoTesting
import Synchronization
import Testing

/// The connection limit, and clients that leave halfway. bench/floods runs the same at scale
/// against a release build (bench/RESULTS.md).
@Suite("MicroHTTPD connection limit and departing clients")
struct ConnectionLimitTests {
    static let get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"

    @Test("past the connection limit a new connection is closed unanswered; the open ones are served; once one closes, new ones are served again")
    func connectionLimit() async throws {
        // Timeouts far beyond the read timeout: only the limit can close the extra connection.
        try await withServer({
            $0.connectionLimit = 2
            $0.threads = 2
            $0.idleTimeout = .seconds(600)
            $0.headerTimeout = .seconds(600)
        }, handler: echo) { server in
            var held = try (0..<2).map { _ in try RawHTTPConnection(port: Int(server.port)) }
            for connection in held {
                try await connection.send(Self.get)
                #expect(try await connection.readResponse()?.status == 200)
            }
            // Before the fix libmicrohttpd stopped accepting: the connection sat in the listen
            // backlog, its request unanswered, until one of the others closed.
            for _ in 0..<3 {
                let extra = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(60))
                try? await extra.send(Self.get)
                #expect(try await extra.readResponse() == nil)
            }
            for connection in held {
                try await connection.send(Self.get)
                #expect(try await connection.readResponse()?.status == 200)
            }
            held.removeFirst().reset()
            #expect(await eventually { server.openConnections == 1 })
            let next = try RawHTTPConnection(port: Int(server.port))
            try await next.send(Self.get)
            #expect(try await next.readResponse()?.status == 200)
        }
    }

    @Test("clients leaving mid-head, mid-body (declared or chunked) or while the handler runs, by close or reset, leave nothing open or in flight",
          arguments: [false, true])
    func departingClients(reset: Bool) async throws {
        let release = AsyncGate()
        let handler: HTTPServer.Handler = { request in
            if request.target == "/hold" { await release.wait() }
            return ServerResponse(status: 200, body: Array(repeating: 65, count: 100_000))
        }
        try await withServer({ $0.idleTimeout = .seconds(600); $0.headerTimeout = .seconds(600); $0.requestTimeout = .seconds(600) },
                             handler: handler) { server in
            let port = Int(server.port)
            let partial = [
                "GET / HTTP/1.1\r\nHost: x\r\nX-Half",
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + String(repeating: "b", count: 1000),
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + String(repeating: "c", count: 1024) + "\r\n100\r\n",
            ]
            var connections: [RawHTTPConnection] = []
            for (index, bytes) in (partial + Array(repeating: "GET /hold HTTP/1.1\r\nHost: x\r\n\r\n", count: 3)).enumerated() {
                let connection = try RawHTTPConnection(port: port)
                try await connection.send(bytes)
                connections.append(connection)
                // Each one is seen by the server before any leaves.
                #expect(await eventually { server.openConnections == index + 1 })
            }
            #expect(await eventually { server.inFlightRequests == 3 })
            if reset {
                for connection in connections { connection.reset() }
            }
            connections.removeAll()  // closes the rest
            // The three waiting on their handler too: noticed while suspended, their handlers cancelled.
            #expect(await eventually { server.inFlightRequests == 0 && server.openConnections == 0 })
            release.open()
            #expect(await eventually { server.inFlightRequests == 0 && server.openConnections == 0 })
            let next = try RawHTTPConnection(port: port)
            try await next.send(Self.get)
            #expect(try await next.readResponse()?.status == 200)
        }
    }
}

@Suite("MicroHTTPD log under connection churn")
struct ChurnLogTests {
    @Test("clients leaving mid-request are counted in a summary line, not logged one by one")
    func departuresSummarized() async throws {
        let lines = Mutex<[String]>([])
        try await withServer({ configuration in
            configuration.errorLog = { line in lines.withLock { $0.append(line) } }
        }, handler: echo) { server in
            for _ in 0..<20 {
                let connection = try RawHTTPConnection(port: Int(server.port))
                try await connection.send("GET / HTTP/1.1\r\nHost: x\r\nX-Ha")
                #expect(await eventually { server.openConnections == 1 })
                connection.reset()
                #expect(await eventually { server.openConnections == 0 })
            }
            #expect(await eventually { lines.withLock { $0.contains { $0.contains("clients closed or reset connections") } } })
            // libmicrohttpd's own per-connection messages (before: one or two lines per connection).
            let perConnection = ["Socket has been disconnected", "Connection was closed by remote side"]
            let logged = lines.withLock { $0 }
            #expect(!logged.contains { line in perConnection.contains { line.hasPrefix($0) } }, "\(logged)")
        }
    }
}
