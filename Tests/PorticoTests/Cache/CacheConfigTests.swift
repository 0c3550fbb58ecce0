import Portico
import Testing

@Suite("Cache configuration")
struct CacheConfigTests {
    func cache(_ body: String) throws -> CacheConfig? {
        let config = try load("middleware:\n  c:\n    type: cache\n" + body + minimalRoute)
        guard let cache = config.middleware["c"]?.settings(as: CacheConfig.self) else { return nil }
        return cache
    }

    @Test("defaults: 64 MiB, 1 MiB objects, no heuristics, no stale fallbacks, no X-Cache")
    func defaults() throws {
        let c = try #require(try cache(""))
        #expect(c == CacheConfig())
        #expect(c.maxBytes == 64 << 20 && c.maxObjectBytes == 1 << 20 && c.heuristicFraction == 0)
        #expect(c.staleWhileRevalidate == .zero && c.staleIfError == .zero && !c.xCache)
    }

    @Test("every key")
    func everyKey() throws {
        let c = try #require(try cache("""
                max_bytes: 256MiB
                max_object_bytes: 8MiB
                heuristic_fraction: 10%
                heuristic_max: 12h
                stale_while_revalidate: 30s
                stale_if_error: 5m
                revalidation_timeout: 3s
                max_in_flight: 64
                x_cache: true
                targeted_cache_control: [Portico-Cache-Control, CDN-Cache-Control]

            """))
        #expect(c.maxBytes == 256 << 20 && c.maxObjectBytes == 8 << 20)
        #expect(c.heuristicFraction == 0.1 && c.heuristicMax == .seconds(43_200))
        #expect(c.staleWhileRevalidate == .seconds(30) && c.staleIfError == .seconds(300))
        #expect(c.revalidationTimeout == .seconds(3) && c.maxInFlight == 64 && c.xCache)
        #expect(c.targetedCacheControl.map(\.canonicalName) == ["portico-cache-control", "cdn-cache-control"])
    }

    @Test("invalid values name the key", arguments: [
        ("max_bytes: 10", "middleware.c.max_bytes: must be at least 1024 bytes"),
        ("max_bytes: lots", "middleware.c.max_bytes: invalid size \"lots\" (expected e.g. 512B, 64KiB, 10MiB, 1GB)"),
        ("max_object_bytes: 1GiB", "middleware.c.max_object_bytes: must not be greater than max_bytes"),
        ("heuristic_fraction: 0.1", "middleware.c.heuristic_fraction: expected a percentage such as 20%, got \"0.1\""),
        ("revalidation_timeout: 0", "middleware.c.revalidation_timeout: must be greater than 0"),
        ("max_in_flight: 0", "middleware.c.max_in_flight: must be between 1 and 1000000, got 0"),
        ("x_cache: maybe", "middleware.c.x_cache: expected true or false, got \"maybe\""),
        ("targeted_cache_control: [Cache-Control]", "middleware.c.targeted_cache_control[0]: Cache-Control is what "
            + "targeted fields take precedence over; list only targeted fields such as CDN-Cache-Control"),
        ("targeted_cache_control: [CDN-Cache-Control, cdn-cache-control]",
         "middleware.c.targeted_cache_control[1]: cdn-cache-control is listed twice"),
        ("targeted_cache_control: [\"CDN Cache\"]", "middleware.c.targeted_cache_control[0]: invalid header name \"CDN Cache\""),
        ("targeted_cache_control: CDN-Cache-Control", "middleware.c.targeted_cache_control: expected a list, got \"CDN-Cache-Control\""),
        ("max_bytez: 1MiB", "middleware.c.max_bytez: unknown key \"max_bytez\" (did you mean \"max_bytes\"?)"),
        ("store: fleet", "middleware.c.store: unknown store \"fleet\""),
        ("max_entry_bytes: 64KiB", "middleware.c.max_entry_bytes: applies only with store: NAME (the fleet tier)"),
        ("store_wait: 2s", "middleware.c.store_wait: applies only with store: NAME (the fleet tier)"),
    ])
    func invalid(line: String, expected: String) {
        #expect(diagnostics("middleware:\n  c:\n    type: cache\n    \(line)\n" + minimalRoute) == ["portico.yaml:4 \(expected)"])
    }

    @Test("store: a stores entry, with max_entry_bytes and store_wait")
    func fleetTier() throws {
        let config = try load("""
            stores:
              fleet: { type: redis, url: "redis://127.0.0.1:6379" }
            middleware:
              c: { type: cache, store: fleet, max_entry_bytes: 64KiB, store_wait: 3s }

            """ + minimalRoute)
        let c = try #require(config.middleware["c"]?.settings(as: CacheConfig.self))
        #expect(c.store == "fleet" && c.maxEntryBytes == 64 << 10 && c.storeWait == .seconds(3))
        #expect(CacheConfig().store == nil && CacheConfig().maxEntryBytes == 1 << 20 && CacheConfig().storeWait == .seconds(1))
    }
}
