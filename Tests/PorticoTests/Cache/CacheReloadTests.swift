import Foundation
import Logging
import Portico
import PorticoTesting
import Testing

@Suite("Cache across reloads")
struct CacheReloadTests {
    static func config(maxBytes: Int) -> PorticoConfig {
        var config = PorticoConfig()
        config.upstreams["app"] = UpstreamConfig(name: "app", url: URL(string: "http://127.0.0.1:9")!)
        var cache = CacheConfig()
        cache.maxBytes = maxBytes
        config.middleware["cache"] = .cache(cache)
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api/"), upstream: "app", middleware: ["cache"])]
        return config
    }

    @Test("an unchanged cache keeps its stored responses; a changed one starts empty")
    func keepsUnchangedStore() async throws {
        let logger = CacheFixture.logger
        let first = try GatewayRuntime(config: Self.config(maxBytes: 1 << 20), logger: logger)
        let store = try #require(first.caches.first?.store)
        store.insert(CacheFixture.entry([("Cache-Control", "max-age=60")], clock: ManualClock()))
        let same = try GatewayRuntime(config: Self.config(maxBytes: 1 << 20), logger: logger, previous: first)
        let changed = try GatewayRuntime(config: Self.config(maxBytes: 2 << 20), logger: logger, previous: same)
        #expect(same.caches.first?.store.storedBytes == store.storedBytes && store.storedBytes > 0)
        #expect(changed.caches.first?.store.storedBytes == 0)
        await first.shutdown()
        await same.shutdown()
        await changed.shutdown()
    }
}
