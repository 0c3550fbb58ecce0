import MicroHTTPD
import Portico
import PorticoTesting
import Testing

@Suite("Quota across reloads")
struct QuotaReloadTests {
    /// A store nobody answers on, so the counts are the local ones (`on_store_error: local`) and
    /// what a reload hands over shows in the statuses.
    static func config(store port: Int, limit: Int) -> PorticoConfig {
        var config = PorticoConfig()
        var store = StoreConfig(host: "127.0.0.1", port: port)
        store.timeout = .seconds(5)
        config.stores["fleet"] = store
        config.middleware["quota"] = .quota(QuotaConfig(limit: limit, per: .day, store: "fleet"))
        config.routes = [RouteConfig(name: "ping", match: .init(path: "/ping"), direct: .init(body: "pong"),
                                     middleware: ["quota"])]
        return config
    }

    static func status(_ gateway: Gateway) async -> Int {
        await gateway.handle(ServerRequest(method: "GET", target: "/ping", headers: [("Host", "gw.test")],
                                           clientAddress: "192.0.2.7")).status
    }

    @Test("a reload with unchanged settings keeps the counts; changed settings start from what the store says")
    func keepsCounts() async throws {
        let refusing = try RefusingPort()
        let clock = ManualClock()
        let logger = RetryFixture.logger
        let first = try GatewayRuntime(config: Self.config(store: refusing.port, limit: 2), logger: logger, clock: clock)
        let gateway = Gateway(runtime: first, logger: logger, clock: clock)
        #expect(await Self.status(gateway) == 200)
        #expect(await Self.status(gateway) == 200)
        #expect(await Self.status(gateway) == 429)

        let same = try GatewayRuntime(config: Self.config(store: refusing.port, limit: 2), logger: logger, clock: clock,
                                      previous: gateway.current)
        gateway.install(same)
        #expect(await Self.status(gateway) == 429)

        // Another limit: with the store away, nothing is known of this window yet.
        let changed = try GatewayRuntime(config: Self.config(store: refusing.port, limit: 3), logger: logger, clock: clock,
                                         previous: gateway.current)
        gateway.install(changed)
        #expect(await Self.status(gateway) == 200)
        for runtime in [first, same, changed] {
            await runtime.shutdown()
        }
    }
}
