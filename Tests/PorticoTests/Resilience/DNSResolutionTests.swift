import Foundation
import Logging
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// A resolver whose answer the test changes (or makes fail).
final class ScriptedResolver: EndpointResolver {
    private let state = Mutex<(answer: [String]?, calls: Int)>((nil, 0))

    func answer(_ addresses: [String]?) { state.withLock { $0.answer = addresses } }
    var calls: Int { state.withLock { $0.calls } }

    func resolve(_ host: String) async throws -> [String] {
        let answer = state.withLock { state -> [String]? in
            state.calls += 1
            return state.answer
        }
        guard let answer else { throw ResolutionError(description: "scripted failure for \(host)") }
        return answer
    }
}

/// Issue #34: `url:` with a host name and `dns_refresh` means every address the name resolves to.
@Suite("Resilience: DNS")
struct DNSResolutionTests {
    @Test("new addresses get traffic, removed ones drain (their exchange in flight finishes), a resolver failure keeps the last set",
          arguments: UpstreamConfig.Transport.allCases)
    func answerChanges(transport: UpstreamConfig.Transport) async throws {
        let upstreams = ["127.0.0.1", "127.0.0.2", "127.0.0.3"].map { TestUpstream(host: $0) }
        let gate = AsyncGate()
        for upstream in upstreams {
            upstream.route("/slow") { _ in
                await gate.wait()
                return .text("late\n")
            }
        }
        try await upstreams[0].start()
        let port = upstreams[0].port
        for upstream in upstreams.dropFirst() { try await upstream.start(port: port) }
        let resolver = ScriptedResolver()
        resolver.answer(["127.0.0.1", "127.0.0.2"])
        let clock = ManualClock()
        var config = UpstreamConfig(name: "named", url: URL(string: "http://backend.test:\(port)")!)
        config.transport = transport
        config.dnsRefresh = .seconds(30)
        // Far beyond the clock's moves: a held request never reaches its deadline here.
        config.timeout = .seconds(3600)
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        let upstream = BalancedUpstream(config: config, logger: logger, loops: .shared, clock: clock, resolver: resolver) {
            makeTransportClient($0, logger: logger, loops: .shared)
        }
        let context: @Sendable () -> RequestContext = { RequestContext(requestID: "r", deadline: clock.now.advanced(by: .seconds(3600)), logger: logger, clock: clock) }
        try await Eventually.wait("the first answer") { upstream.endpoints.map(\.address) == ["127.0.0.1:\(port)", "127.0.0.2:\(port)"] }
        for _ in 0..<10 {
            let response = try await upstream.send(Fixture.request(.get, "/echo"), context: context())
            #expect(try await response.echo().values("host") == ["backend.test:\(port)"])
        }
        #expect(upstreams[0].hits("/echo") == 5 && upstreams[1].hits("/echo") == 5 && upstreams[2].hits("/echo") == 0)

        // A request held on 127.0.0.1 while the name moves to .2 and .3.
        let held = Task { try await upstream.send(Fixture.request(.get, "/slow"), context: context()) }
        try await Eventually.wait("a request held upstream") { upstreams.map { $0.hits("/slow") }.reduce(0, +) == 1 }
        let holder = upstreams[0].hits("/slow") == 1 ? "127.0.0.1" : "127.0.0.2"
        resolver.answer([holder == "127.0.0.1" ? "127.0.0.2" : "127.0.0.1", "127.0.0.3"])
        let calls = resolver.calls
        try await Eventually.wait("the refresh sleeping") { clock.sleeperCount >= 1 }
        clock.advance(by: .seconds(30))
        try await Eventually.wait("the second answer applied") { upstream.endpoints.map(\.address).contains("127.0.0.3:\(port)") }
        #expect(resolver.calls == calls + 1)
        #expect(!upstream.endpoints.map(\.address).contains("\(holder):\(port)"))
        let before = upstreams.map { $0.hits("/echo") }
        for _ in 0..<10 { _ = try await upstream.send(Fixture.request(.get, "/echo"), context: context()) }
        let gained = zip(upstreams.map { $0.hits("/echo") }, before).map { $0 - $1 }
        #expect(gained[2] == 5, "the new address takes traffic: \(gained)")
        #expect(gained[holder == "127.0.0.1" ? 0 : 1] == 0, "the removed address gets none: \(gained)")
        gate.open()
        let drained = try await held.value
        #expect(drained.status.code == 200)
        #expect(String(decoding: try await drained.collectedBytes(), as: UTF8.self) == "late\n")

        // The resolver fails: the last good set stays.
        let kept = upstream.endpoints.map(\.address)
        resolver.answer(nil)
        try await Eventually.wait("the refresh sleeping") { clock.sleeperCount >= 1 }
        clock.advance(by: .seconds(30))
        try await Eventually.wait("the failed resolution") { resolver.calls == calls + 2 }
        #expect(upstream.endpoints.map(\.address) == kept)
        let response = try await upstream.send(Fixture.request(.get, "/echo"), context: context())
        #expect(response.status.code == 200)
        await upstream.shutdown()
        for upstream in upstreams { await upstream.shutdown() }
    }

    @Test("dns_refresh needs url: with a host name, and transport nio for https")
    func configuration() throws {
        let config = try load("""
            upstreams:
              named: { url: "http://localhost:9000", transport: nio, dns_refresh: 10s }
            \(minimalRoute)
            """)
        #expect(config.upstreams["named"]?.dnsRefresh == .seconds(10))
        let plain = try load("""
            upstreams:
              named: { url: "http://localhost:9000", dns_refresh: 10s }
            \(minimalRoute)
            """)
        #expect(plain.upstreams["named"]?.dnsRefresh == .seconds(10), "an http upstream on urlsession")
        #expect(diagnostics("""
            upstreams:
              a: { url: "http://127.0.0.1:9000", transport: nio, dns_refresh: 10s }
              b: { url: "https://localhost:9000", dns_refresh: 10s }
              c: { endpoints: ["http://x:1", "http://y:1"], transport: nio, dns_refresh: 10s }
            \(minimalRoute)
            """) == [
            "portico.yaml:2 upstreams.a.dns_refresh: applies to url: with a host name, not an address",
            "portico.yaml:3 upstreams.b.dns_refresh: needs transport: nio for an https upstream (urlsession would check the certificate against the address it connects to, not the name)",
            "portico.yaml:4 upstreams.c.dns_refresh: applies to url: with a host name, not to endpoints",
        ])
    }
}
