/// The memory tier in front of the fleet tier: lookups answer from memory alone (a hit never
/// waits for Redis), while every store and removal reaches both — a response stored, a 304's
/// freshened headers, an unsafe method's invalidation. Reading the fleet tier on a memory miss
/// is the middleware's (asynchronous) step, `CacheMiddleware.consultFleet`.
final class TieredCacheStore: CacheStore {
    let memory: InMemoryCacheStore
    let fleet: SharedCacheTier
    private let clock: any GatewayClock

    init(memory: InMemoryCacheStore, fleet: SharedCacheTier, clock: any GatewayClock) {
        self.memory = memory
        self.fleet = fleet
        self.clock = clock
    }

    func variants(for key: String) -> [CacheEntry] {
        memory.variants(for: key)
    }

    @discardableResult
    func insert(_ entry: CacheEntry) -> CacheStoreChange {
        let change = memory.insert(entry)
        fleet.write(entry, now: clock.now, wallNow: clock.wallNow)
        return change
    }

    /// A removal is an invalidation: Redis drops the key and every replica hears of it. A key
    /// this memory never held may still be held by others, so it goes out either way.
    @discardableResult
    func removeAll(for key: String) -> CacheStoreChange {
        fleet.invalidate(key)
        return memory.removeAll(for: key)
    }

    var storedBytes: Int { memory.storedBytes }
}
