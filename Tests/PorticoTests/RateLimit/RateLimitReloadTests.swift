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

@Suite("Pace across reloads")
struct PaceReloadTests {
    static func yaml(maxWait: String, providerWait: String) -> String {
        """
        upstreams:
          vendor:
            url: http://127.0.0.1:9
            transport: nio
            provider_limits: { scope: route, max_wait: \(providerWait) }
        middleware:
          paced: { type: rate_limit, key: route, rate: 1/s, burst: 1, on_limit: wait, max_wait: \(maxWait) }
        routes:
          - { name: api, match: { path_prefix: / }, upstream: vendor, middleware: [paced] }
        """
    }

    @Test("unchanged settings keep the waiting queue and what was learned of the provider; changed ones start afresh")
    func keepsQueueAndLearnedState() async throws {
        let logger = RetryFixture.logger
        let clock = ManualClock()
        let first = try GatewayRuntime(config: try ConfigLoader.load(yaml: Self.yaml(maxWait: "2s", providerWait: "5s"), environment: [:]),
                                       logger: logger, clock: clock)
        let same = try GatewayRuntime(config: try ConfigLoader.load(yaml: Self.yaml(maxWait: "2s", providerWait: "5s"), environment: [:]),
                                      logger: logger, clock: clock, previous: first)
        let changed = try GatewayRuntime(config: try ConfigLoader.load(yaml: Self.yaml(maxWait: "3s", providerWait: "6s"), environment: [:]),
                                         logger: logger, clock: clock, previous: same)
        let queue = { (runtime: GatewayRuntime) in (runtime.middleware["paced"] as? RateLimitMiddleware)?.queue }
        #expect(queue(first) != nil)
        #expect(queue(same) === queue(first))
        #expect(first.providerLimiters["vendor"] != nil)
        #expect(same.providerLimiters["vendor"] === first.providerLimiters["vendor"])
        #expect(changed.providerLimiters["vendor"] !== same.providerLimiters["vendor"])
        #expect(queue(changed) !== queue(same))
        for runtime in [first, same, changed] { await runtime.shutdown() }
    }
}
