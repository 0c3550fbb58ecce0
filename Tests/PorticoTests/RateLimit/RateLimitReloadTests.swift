import MicroHTTPD
import Portico
import PorticoTesting
import Testing

@Suite("Rate limit across reloads")
struct RateLimitReloadTests {
    static func config(burst: Int) -> PorticoConfig {
        var config = PorticoConfig()
        config.middleware["limit"] = .rateLimit(RateLimitConfig(rate: Rate(count: 1, per: .seconds(60)), burst: burst))
        config.routes = [RouteConfig(name: "ping", match: .init(path: "/ping"), direct: .init(body: "pong"),
                                     middleware: ["limit"])]
        return config
    }

    static func status(_ gateway: Gateway) async -> Int {
        await gateway.handle(ServerRequest(method: "GET", target: "/ping", headers: [("Host", "gw.test")],
                                           clientAddress: "192.0.2.7")).status
    }

    @Test("a bucket drained before a reload with unchanged settings stays drained; changed settings refill it")
    func keepsBuckets() async throws {
        let clock = ManualClock()
        let logger = RetryFixture.logger
        let first = try GatewayRuntime(config: Self.config(burst: 2), logger: logger, clock: clock)
        let gateway = Gateway(runtime: first, logger: logger, clock: clock)
        #expect(await Self.status(gateway) == 200)
        #expect(await Self.status(gateway) == 200)
        #expect(await Self.status(gateway) == 429)

        let same = try GatewayRuntime(config: Self.config(burst: 2), logger: logger, clock: clock, previous: gateway.current)
        gateway.install(same)
        #expect(await Self.status(gateway) == 429)

        let changed = try GatewayRuntime(config: Self.config(burst: 3), logger: logger, clock: clock, previous: gateway.current)
        gateway.install(changed)
        #expect(await Self.status(gateway) == 200)
        for runtime in [first, same, changed] {
            await runtime.shutdown()
        }
    }
}
