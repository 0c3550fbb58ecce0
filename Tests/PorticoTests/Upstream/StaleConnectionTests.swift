import Foundation
import HTTPTypes
import MetricsTestKit
import NIOCore
import PorticoTesting
import Testing
@testable import Portico

/// Issue #45 against a real server on 127.0.0.1 that closes kept-alive connections
/// (`ClosingUpstream`): the `nio` transport sends a request that met a stale connection once
/// more on a new one where that is safe, and counts it in `portico_upstream_stale_retries_total`.
/// The client runs on one event loop of its own, its requests on that loop, as a gateway's do.
@Suite("Stale connections: a server closing kept-alive connections (nio)")
struct StaleConnectionTests {
    static func with(_ server: ClosingUpstream,
                     _ body: (NIOUpstream, EventLoops, TestMetrics) async throws -> Void) async throws {
        try await server.start()
        var config = UpstreamConfig(name: "stale", url: URL(string: "http://127.0.0.1:\(server.port)")!)
        config.transport = .nio
        // Generous for a loaded machine; an idle connection outlives any pause between two requests.
        config.timeout = .seconds(60)
        config.connectTimeout = .seconds(30)
        config.idleTimeout = .seconds(600)
        let loops = EventLoops(count: 1)
        let metrics = TestMetrics()
        let client = NIOUpstream(config: config, logger: Fixture.logger, loops: loops, metricsFactory: metrics)
        do {
            try await body(client, loops, metrics)
        } catch {
            await client.shutdown()
            await server.shutdown()
            await loops.shutdown()
            throw error
        }
        await client.shutdown()
        await server.shutdown()
        await loops.shutdown()
    }

    /// One request from a task on the client's loop: the answer's status and body, or the
    /// gateway error's kind.
    static func send(_ client: NIOUpstream, on loops: EventLoops, _ method: HTTPRequest.Method, _ path: String,
                     body: String = "") async throws -> String {
        try await withTaskExecutorPreference(loops.executors[0]) {
            try await outcome(client, method, path, body: body)
        }
    }

    /// `send`'s outcome, for a caller already on the client's loop.
    static func outcome(_ client: NIOUpstream, _ method: HTTPRequest.Method, _ path: String, body: String = "") async throws -> String {
        do {
            let response = try await client.send(Fixture.request(method, path, body: Array(body.utf8)),
                                                 context: Fixture.context(deadlineIn: .seconds(60)))
            return "\(response.status.code) \(String(decoding: try await response.collectedBytes(), as: UTF8.self))"
        } catch let error as GatewayError {
            return error.kind.name
        }
    }

    static func resends(_ metrics: TestMetrics) throws -> Int64 {
        try metrics.expectCounter("portico_upstream_stale_retries_total", [("upstream", "stale")]).totalValue
    }

    @Test("a GET that a server hangs up on, on a reused connection, goes out once more on a new one: 200, one resend counted")
    func getResentAfterHangUp() async throws {
        let server = ClosingUpstream(script: [.answer, .hangUp])
        try await Self.with(server) { client, loops, metrics async throws in
            #expect(try await Self.send(client, on: loops, .get, "/one") == "200 GET /one ")
            #expect(try Self.resends(metrics) == 0)
            #expect(try await Self.send(client, on: loops, .get, "/two") == "200 GET /two ")
            #expect(server.requests.map { "\($0.connection) \($0.path)" } == ["1 /one", "1 /two", "2 /two"])
            #expect(server.accepted == 2)
            #expect(try Self.resends(metrics) == 1)
            // The new connection is pooled as any other.
            #expect(try await Self.send(client, on: loops, .get, "/three") == "200 GET /three ")
            #expect(server.accepted == 2)
        }
    }

    @Test("a POST the server may have read is not sent twice: 502 upstream_connection_closed, nothing resent")
    func postNotResentAfterWrite() async throws {
        let server = ClosingUpstream(script: [.answer, .hangUp])
        try await Self.with(server) { client, loops, metrics async throws in
            #expect(try await Self.send(client, on: loops, .get, "/one") == "200 GET /one ")
            #expect(try await Self.send(client, on: loops, .post, "/pay", body: "1") == "upstream_connection_closed")
            #expect(server.requests.filter { $0.path == "/pay" }.count == 1)
            #expect(server.accepted == 1)
            #expect(try Self.resends(metrics) == 0)
        }
    }

    @Test("a response that had begun when the connection dropped is never resent: 502")
    func startedResponseNotResent() async throws {
        let server = ClosingUpstream(script: [.answer, .headThenClose])
        try await Self.with(server) { client, loops, metrics async throws in
            #expect(try await Self.send(client, on: loops, .get, "/one") == "200 GET /one ")
            #expect(try await Self.send(client, on: loops, .get, "/two") == "upstream_connection_closed")
            #expect(server.requests.count == 2 && server.accepted == 1)
            #expect(try Self.resends(metrics) == 0)
        }
    }

    @Test("a new connection that closes under its first request is not resent (nothing was stale): 502")
    func newConnectionNotResent() async throws {
        let server = ClosingUpstream(script: [.hangUp])
        try await Self.with(server) { client, loops, metrics async throws in
            #expect(try await Self.send(client, on: loops, .get, "/one") == "upstream_connection_closed")
            #expect(server.accepted == 1)
            #expect(try Self.resends(metrics) == 0)
        }
    }

    @Test("a resend that fails too is not resent again: one resend, then 502", arguments: [ClosingUpstream.Next.hangUp, .headThenClose])
    func resendOnce(second: ClosingUpstream.Next) async throws {
        let server = ClosingUpstream(script: [.answer, .hangUp, second])
        try await Self.with(server) { client, loops, metrics async throws in
            #expect(try await Self.send(client, on: loops, .get, "/one") == "200 GET /one ")
            #expect(try await Self.send(client, on: loops, .get, "/two") == "upstream_connection_closed")
            #expect(server.accepted == 2)
            #expect(try Self.resends(metrics) == 1)
        }
    }

    /// The race of an nginx reload, held still: the server closes the idle connection while the
    /// client's loop is busy (this very task, on it), and the FIN is in the client's kernel
    /// (`LoopbackTCP`) before the loop can read it. The request then meets a connection the pool
    /// still takes for open.
    static func sendAfterSilentClose(_ client: NIOUpstream, on loops: EventLoops, server: ClosingUpstream,
                                     _ method: HTTPRequest.Method, _ path: String, body: String = "") async throws -> String {
        try await withTaskExecutorPreference(loops.executors[0]) {
            #expect(try await outcome(client, .get, "/warm") == "200 GET /warm ")
            // From here to the request's write nothing suspends: the loop reads nothing meanwhile.
            try #require(loops.loops[0].inEventLoop, "on the client's loop, holding it")
            let ports = server.closeIdle()
            try #require(ports.count == 1, "the one pooled connection closed by the server")
            try LoopbackTCP.wait(localPort: ports[0], remotePort: server.port, for: LoopbackTCP.closeWait, timeout: .seconds(60))
            return try await outcome(client, method, path, body: body)
        }
    }

    @Test("a POST on a connection the server had already closed goes out on a new one (it cannot have been read): 200")
    func postResentBeforeWrite() async throws {
        let server = ClosingUpstream()
        try await Self.with(server) { client, loops, metrics async throws in
            #expect(try await Self.sendAfterSilentClose(client, on: loops, server: server, .post, "/pay", body: "12") == "200 POST /pay 12")
            #expect(server.requests.map { "\($0.connection) \($0.method) \($0.path)" } == ["1 GET /warm", "2 POST /pay"],
                    "the POST reached the server once, on the new connection")
            #expect(try Self.resends(metrics) == 1)
        }
    }

    @Test("a GET on a connection the server had already closed is written, meets the close, and goes out on a new one: 200")
    func getResentAfterSilentClose() async throws {
        let server = ClosingUpstream()
        try await Self.with(server) { client, loops, metrics async throws in
            #expect(try await Self.sendAfterSilentClose(client, on: loops, server: server, .get, "/two") == "200 GET /two ")
            #expect(server.requests.map { "\($0.connection) \($0.path)" } == ["1 /warm", "2 /two"])
            #expect(try Self.resends(metrics) == 1)
        }
    }

    // MARK: urlsession

    /// What libcurl (under FoundationNetworking) does on its own, measured: a request on a
    /// reused connection that got no byte back is sent again on a new connection, whatever its
    /// method (`Curl_retry_request`). A GET is then answered. A request with a body is not:
    /// its body must be rewound, which FoundationNetworking does not manage, and the task
    /// stalls until Portico's deadline (504). Portico cannot reach either from outside libcurl.
    @Test("urlsession: libcurl itself sends a GET hung up on, on a reused connection, again; a POST stalls until the deadline")
    func urlSessionRetriesItself() async throws {
        let server = ClosingUpstream(script: [.answer, .hangUp, .answer, .hangUp])
        try await server.start()
        var config = UpstreamConfig(name: "stale", url: URL(string: "http://127.0.0.1:\(server.port)")!)
        config.transport = .urlsession
        config.timeout = .seconds(60)
        let client = makeUpstreamClient(config, logger: Fixture.logger)
        func send(_ method: HTTPRequest.Method, _ path: String, body: String = "", deadline: Duration = .seconds(60)) async throws -> String {
            do {
                let response = try await client.send(Fixture.request(method, path, body: Array(body.utf8)),
                                                     context: Fixture.context(deadlineIn: deadline))
                return "\(response.status.code) \(String(decoding: try await response.collectedBytes(), as: UTF8.self))"
            } catch let error as GatewayError {
                return error.kind.name
            }
        }
        do {
            #expect(try await send(.get, "/one") == "200 GET /one ")
            #expect(try await send(.get, "/two") == "200 GET /two ")
            #expect(server.requests.map { "\($0.connection) \($0.path)" } == ["1 /one", "1 /two", "2 /two"])
            // Nothing answers it: a short deadline is enough to see it stall.
            #expect(try await send(.post, "/pay", body: "12", deadline: .seconds(3)) == "upstream_timeout")
            #expect(server.requests.filter { $0.path == "/pay" }.count == 1, "never sent again whole")
        } catch {
            await client.shutdown()
            await server.shutdown()
            throw error
        }
        await client.shutdown()
        await server.shutdown()
    }
}
