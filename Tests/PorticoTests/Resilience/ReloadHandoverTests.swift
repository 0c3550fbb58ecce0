import Foundation
import Logging
@testable import Portico
import PorticoTesting
import Testing

/// Issue #34: a reload hands unchanged upstreams (whole) and unchanged endpoints (client and
/// record) to the new runtime; the old runtime's shutdown leaves them serving.
@Suite("Resilience: reload hand-over")
struct ReloadHandoverTests {
    static func config(_ endpoints: [URL], balance: BalanceStrategy, transport: UpstreamConfig.Transport) -> PorticoConfig {
        var config = PorticoConfig()
        var upstream = UpstreamConfig(name: "app", endpoints: endpoints)
        upstream.transport = transport
        upstream.balance = balance
        config.upstreams["app"] = upstream
        var single = UpstreamConfig(name: "single", url: endpoints[0])
        single.transport = transport
        config.upstreams["single"] = single
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/"), upstream: "app", middleware: [])]
        return config
    }

    @Test("after the old runtime shuts down, the taken-over clients still serve", arguments: UpstreamConfig.Transport.allCases)
    func oldShutdownLeavesTakenOver(transport: UpstreamConfig.Transport) async throws {
        let first = TestUpstream(host: "127.0.0.1"), second = TestUpstream(host: "127.0.0.2")
        try await first.start()
        try await second.start()
        let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        let old = try GatewayRuntime(config: Self.config([first.baseURL, second.baseURL], balance: .roundRobin, transport: transport),
                                     logger: logger)
        let new = try GatewayRuntime(config: Self.config([first.baseURL, second.baseURL], balance: .random, transport: transport),
                                     logger: logger, previous: old)
        let oldApp = try #require(old.upstreams["app"] as? BalancedUpstream)
        let newApp = try #require(new.upstreams["app"] as? BalancedUpstream)
        #expect(oldApp !== newApp)
        #expect(zip(oldApp.endpoints, newApp.endpoints).allSatisfy { $0 === $1 })
        #expect(old.upstreams["single"] as AnyObject === new.upstreams["single"] as AnyObject)
        await old.shutdown()
        for _ in 0..<4 {
            let response = try await newApp.send(Fixture.request(), context: Fixture.context())
            #expect(response.status.code == 200)
        }
        let single = try await new.upstreams["single"]!.send(Fixture.request(), context: Fixture.context())
        #expect(single.status.code == 200)
        await new.shutdown()
        await first.shutdown()
        await second.shutdown()
    }
}
