import Foundation
import Portico
import PorticoTesting
import Testing

/// The nio transport's pool of upstream connections, plain and over TLS with `server_name`
/// (`nioServerName`).
@Suite("Upstream connection pool (nio)")
struct ConnectionPoolTests {
    @Test("keep-alive: consecutive requests share one upstream connection", arguments: [Transport.nio, .nioServerName])
    func reuse(transport: Transport) async throws {
        // Far longer than the test: the default 4 s is a clock a loaded machine can outrun between
        // two requests, and an expired connection is rightly replaced by a new one.
        try await Fixture.withUpstream(transport, configure: { $0.idleTimeout = .seconds(600) }) { upstream, client in
            for _ in 0..<5 {
                let response = try await client.send(Fixture.request(.get, "/r"), context: Fixture.context())
                #expect(response.status == .ok)
            }
            #expect(upstream.connections.accepted == 1)
        }
    }

    @Test("idle_timeout: an idle connection is closed by the pool, and the next request opens a new one",
          arguments: [Transport.nio, .nioServerName])
    func idleTimeout(transport: Transport) async throws {
        try await Fixture.withUpstream(transport, configure: { $0.idleTimeout = .milliseconds(100) }) { upstream, client in
            let first = try await client.send(Fixture.request(.get, "/r"), context: Fixture.context())
            #expect(first.status == .ok)
            // The pool, not the upstream, lets go: the upstream never closes a connection here.
            try await Eventually.wait(timeout: .seconds(30), "the idle connection closed by the pool") {
                upstream.connections.open == 0
            }
            let second = try await client.send(Fixture.request(.get, "/r"), context: Fixture.context())
            #expect(second.status == .ok)
            #expect(upstream.connections.accepted == 2)
        }
    }

    @Test("max_connections: a request finding every connection busy waits at most connect_timeout, then 504",
          arguments: [Transport.nio, .nioServerName])
    func busyPoolWaitIsBounded(transport: Transport) async throws {
        try await Fixture.withUpstream(transport, configure: {
            $0.maxConnections = 1
            $0.connectTimeout = .seconds(2)
        }, script: { upstream in
            upstream.route("/slow", .text("late").delayed(by: .seconds(60)))
        }) { upstream, client in
            let busy = Task { try await client.send(Fixture.request(.get, "/slow"), context: Fixture.context(deadlineIn: .seconds(90))) }
            try await Eventually.wait(timeout: .seconds(30), "the only connection busy") { upstream.hits("/slow") == 1 }
            let (error, elapsed) = await Fixture.expectGatewayError {
                try await client.send(Fixture.request(.get, "/r"), context: Fixture.context(deadlineIn: .seconds(60)))
            }
            #expect(error?.code == "upstream_timeout")
            #expect(error?.message.contains("connect timeout") == true, "\(String(describing: error))")
            #expect(elapsed >= .milliseconds(1900))
            #expect(elapsed < .seconds(30), "took \(elapsed)")
            #expect(upstream.connections.accepted == 1)
            busy.cancel()
            _ = try? await busy.value
        }
    }

    @Test("the default idle timeout stays below the 5 s keep-alive of Node.js, uvicorn and Apache")
    func defaultBelowCommonKeepAlive() {
        #expect(UpstreamConfig(name: "u", url: URL(string: "http://u")!).idleTimeout < .seconds(5))
    }
}
