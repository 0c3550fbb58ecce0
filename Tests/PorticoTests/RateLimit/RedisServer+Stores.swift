import Logging
@testable import Portico
import PorticoTesting

extension RedisServer {
    /// The stores of a configuration with one Redis store, `fleet`, on this server (the unit
    /// tests' fleet: rate-limit buckets, provider budgets and the cache tier all use it).
    func fleetStores(timeout: Duration) throws -> RateLimitStores {
        var store = StoreConfig(host: "127.0.0.1", port: port)
        store.timeout = timeout
        return try RateLimitStores(stores: ["fleet": store], logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
    }
}
