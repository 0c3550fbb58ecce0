import Foundation
import Portico
import PorticoTesting
import Synchronization
import Testing

/// Operations under load: a reload or a drain must not lose a request (every request that
/// reached the gateway gets a complete response).
@Suite("Reload and drain under load")
struct ReloadDrainTests {
    static func config(upstream: TestUpstream, variant: Int) -> PorticoConfig {
        var config = PorticoConfig()
        config.listen.requestTimeout = .seconds(300)
        // A loaded machine may take seconds between opening a held connection and sending on it.
        config.listen.headerTimeout = .seconds(300)
        var settings = UpstreamConfig(name: "up", url: URL(string: "http://127.0.0.1:\(upstream.port)")!)
        settings.transport = variant % 2 == 0 ? .nio : .urlsession
        settings.connectTimeout = .seconds(30)
        settings.timeout = .seconds(300)
        config.upstreams = ["up": settings]
        config.routes = [
            // Deadlines far beyond the test's length: the drain test holds requests while a loaded machine catches up.
            RouteConfig(name: "api", match: .init(pathPrefix: "/api"), upstream: "up", timeout: .seconds(200 + variant)),
            RouteConfig(name: "version", match: .init(path: "/version"), direct: .init(status: 200, body: "v\(variant)")),
        ]
        return config
    }

    struct Tally: Sendable {
        var ok = 0
        var lost = 0
        var failures: [String] = []
    }

    final class Load: Sendable {
        let stop = Atomic<Bool>(false)
        let tally = Mutex(Tally())
    }

    /// Workers send requests on fresh connections until `stop` is set.
    static func load(_ gateway: TestGateway, workers: Int, state: Load) async {
        await withTaskGroup(of: Void.self) { group in
            for worker in 0..<workers {
                group.addTask {
                    var index = 0
                    // A failing test leaves by throwing: cancellation must end the load too.
                    while !state.stop.load(ordering: .relaxed) && !Task.isCancelled {
                        index += 1
                        let connection: RawHTTPConnection
                        do { connection = try gateway.connect() } catch { continue }  // refused: never sent, not lost
                        do {
                            try await connection.send("GET /api/w\(worker)/r\(index) HTTP/1.1\r\nHost: x\r\n\r\n")
                            let response = try await connection.readResponse()
                            state.tally.withLock { tally in
                                if response?.status == 200 { tally.ok += 1 } else {
                                    tally.lost += 1
                                    tally.failures.append("status \(response.map { String($0.status) } ?? "none")")
                                }
                            }
                        } catch {
                            state.tally.withLock { $0.lost += 1; $0.failures.append("\(error)") }
                        }
                    }
                }
            }
        }
    }

    @Test("ten reloads under load lose no request, and the new configuration takes effect")
    func reloads() async throws {
        let upstream = TestUpstream()
        try await upstream.start()
        let gateway = try TestGateway(Self.config(upstream: upstream, variant: 0))
        let state = Load()
        async let loading: Void = Self.load(gateway, workers: 8, state: state)
        // Declared after `loading`, so on a throw it runs before the implicit await of `loading`.
        defer { state.stop.store(true, ordering: .relaxed) }
        for variant in 1...10 {
            try await Eventually.wait(timeout: .seconds(120)) { state.tally.withLock { $0.ok } >= variant * 20 }
            try gateway.server.reload(Self.config(upstream: upstream, variant: variant))
        }
        try await Eventually.wait(timeout: .seconds(120)) { state.tally.withLock { $0.ok } >= 240 }
        state.stop.store(true, ordering: .relaxed)
        await loading
        let result = state.tally.withLock { $0 }
        #expect(result.lost == 0, "\(result.failures.prefix(5))")
        #expect(result.ok >= 240)
        #expect(try await gateway.request("GET", "/version").bodyText == "v10")
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("a drain completes every in-flight request, then stops accepting")
    func drain() async throws {
        // The upstream holds every request until the drain has begun.
        let release = AsyncGate()
        let upstream = TestUpstream()
        upstream.route("/api/slow") { request in
            await release.wait()
            return .echo(request)
        }
        try await upstream.start()
        let gateway = try TestGateway(Self.config(upstream: upstream, variant: 0))
        var connections: [RawHTTPConnection] = []
        for _ in 0..<20 {
            let connection = try gateway.connect()
            try await connection.send("GET /api/slow HTTP/1.1\r\nHost: x\r\n\r\n")
            connections.append(connection)
        }
        do {
            try await Eventually.wait(timeout: .seconds(60)) { gateway.server.inFlightRequests == 20 }
        } catch {
            Issue.record("only \(gateway.server.inFlightRequests) of 20 requests in flight; upstream saw \(upstream.totalHits)")
            throw error
        }
        async let drained: Void = gateway.server.shutdown(drainDelay: .zero, grace: .seconds(60))
        try await Eventually.wait { gateway.server.isDraining }
        release.open()
        for connection in connections {
            let response = try #require(try await connection.readResponse())
            #expect(response.status == 200)
            #expect(response.header("connection")?.lowercased() == "close")
        }
        await drained
        #expect((try? gateway.connect()) == nil, "the listener is closed after the drain")
        await upstream.shutdown()
    }

    /// Issue #34: a reload used to cut every response stream of the old runtime once its
    /// requests had had `request_timeout` (+1 s): the upstream connection was closed under it.
    @Test("a response stream in flight at a reload is not cut when the old runtime retires",
          arguments: [UpstreamConfig.Transport.nio, .urlsession])
    func streamSpansReload(transport: UpstreamConfig.Transport) async throws {
        let (events, producer) = AsyncStream<[UInt8]>.makeStream()
        let upstream = TestUpstream()
        upstream.route("/api/events") { _ in
            .streamed(headers: [("Content-Type", "text/event-stream")], events)
        }
        try await upstream.start()
        var config = Self.config(upstream: upstream, variant: transport == .nio ? 0 : 1)
        // Only the manual clock's moves end a stream's silence: it must not be the idle timeout.
        config.routes[0].streamIdleTimeout = .seconds(86_400)
        // The old runtime is retired `request_timeout` + 1 s after the reload, on the gateway's
        // clock: here the test's, so the retirement comes when the test says, however slow the
        // machine (a real 8 s request timeout was both slow and, under load, too short for the head).
        let clock = ManualClock()
        let gateway = try TestGateway(config, clock: clock)
        let client = try StreamingClient(port: gateway.port, timeout: .seconds(120))
        defer { client.close() }
        producer.yield(Array("data: before\n\n".utf8))
        try await client.get("/api/events")
        let head = try await client.readHead()
        try #require(head.status == 200, "\(head.status): \(head.bodyText)")
        _ = try await client.readBody(until: "data: before\n\n")

        // A changed upstream: a new client serves it, and the old one is retired (an unchanged one
        // would be handed over whole and never retired).
        var changed = config
        changed.upstreams["up"]?.timeout = .seconds(299)
        try gateway.server.reload(changed)
        let linger = config.listen.requestTimeout + .seconds(1)
        // The retirement happens while the stream is open. The clock moves past the linger until
        // the retiring task (which may not be asleep yet) has woken and retired the old runtime.
        try await Eventually.wait(timeout: .seconds(120)) {
            clock.advance(by: linger)
            return gateway.server.runtimesRetired == 1
        }
        producer.yield(Array("data: after\n\n".utf8))
        _ = try await client.readBody(until: "data: after\n\n")
        producer.finish()
        #expect(try await client.readBodyToEnd() == .complete)
        // The retired runtime's connection closed once its exchange ended; the new one serves.
        #expect(try await gateway.request("GET", "/version").bodyText == "v\(transport == .nio ? 0 : 1)")
        await gateway.stop()
        await upstream.shutdown()
    }
}
