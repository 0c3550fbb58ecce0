import Portico
import Testing

@Suite("Shared rate-limit stores: configuration")
struct StoreConfigTests {
    let limited = """
        middleware:
          l: { type: rate_limit, rate: 10/s, store: fleet, on_store_error: deny }

        """

    @Test("a redis store with every key, referenced by a rate_limit")
    func everyKey() throws {
        let config = try load("""
            stores:
              fleet:
                type: redis
                url: redis://limiter@cache.internal:6380/2
                password: ${REDIS_PASSWORD}
                pool: 4
                timeout: 40ms
                connect_timeout: 1s
                key_prefix: "app1:"

            """ + limited + minimalRoute, environment: ["REDIS_PASSWORD": "pw"])
        let store = try #require(config.stores["fleet"])
        #expect(store.host == "cache.internal" && store.port == 6380 && store.database == 2)
        #expect(store.username == "limiter" && store.password == "pw" && !store.useTLS)
        #expect(store.pool == 4 && store.timeout == .milliseconds(40) && store.connectTimeout == .seconds(1))
        #expect(store.keyPrefix == "app1:")
        #expect(store.shownURL == "redis://limiter@cache.internal:6380/2")
        let limit = try #require(config.middleware["l"]?.settings(as: RateLimitConfig.self))
        #expect(limit.store == "fleet" && limit.onStoreError == .deny)
    }

    @Test("defaults: pool 8, timeout 25ms, prefix portico:, on_store_error local; rediss:// is TLS")
    func defaults() throws {
        let config = try load("""
            stores: { fleet: { type: redis, url: "rediss://:pw@10.0.0.1" } }
            middleware: { l: { type: rate_limit, rate: 1/s, store: fleet } }

            """ + minimalRoute)
        let store = try #require(config.stores["fleet"])
        #expect(store.pool == 8 && store.timeout == .milliseconds(25) && store.keyPrefix == "portico:")
        #expect(store.useTLS && store.password == "pw" && store.port == 6379)
        #expect(config.middleware["l"]?.settings(as: RateLimitConfig.self)?.onStoreError == .local)
    }

    @Test("an unknown store is an error at its key path, with a suggestion")
    func unknownStore() {
        let found = diagnostics("""
            stores: { fleet: { type: redis, url: "redis://h" } }
            middleware: { l: { type: rate_limit, rate: 1/s, store: flet } }

            """ + minimalRoute)
        #expect(found == ["portico.yaml:2 middleware.l.store: unknown store \"flet\" (did you mean \"fleet\"?)"])
    }

    @Test("invalid store settings", arguments: [
        ("type: memcached\n    url: redis://h", "stores.s.type: expected one of redis, got \"memcached\""),
        ("type: redis\n    url: http://h", "stores.s.url: invalid Redis URL (must start with redis:// or rediss://); expected redis://[user:password@]host[:port][/db] or rediss://…"),
        ("type: redis\n    url: redis://h:70000", "stores.s.url: invalid Redis URL (invalid port); expected redis://[user:password@]host[:port][/db] or rediss://…"),
        ("type: redis\n    url: redis://h\n    pool: 0", "stores.s.pool: must be between 1 and 1024, got 0"),
        ("type: redis\n    url: redis://h\n    timeout: 0", "stores.s.timeout: must be greater than 0"),
        ("type: redis\n    url: redis://h\n    tls: { server_name: cache }", "stores.s.tls: applies to rediss:// URLs only"),
        ("type: redis\n    url: redis://h\n    tiemout: 1s", "stores.s.tiemout: unknown key \"tiemout\" (did you mean \"timeout\"?)"),
    ])
    func invalid(_ body: String, _ expected: String) {
        let found = diagnostics("stores:\n  s:\n    \(body)\n" + minimalRoute)
        #expect(found.count == 1)
        #expect(found.first?.hasSuffix(expected) == true, "\(found)")
    }

    @Test("a password in the URL never appears in a message")
    func secretSafety() {
        let found = diagnostics("stores:\n  s:\n    type: redis\n    url: \"redis://u:hunter2@h:99999\"\n" + minimalRoute)
        #expect(found.count == 1)
        #expect(!found.joined().contains("hunter2"))
    }

    @Test("on_store_error needs a store and one of local, allow, deny")
    func policy() {
        #expect(diagnostics("middleware: { l: { type: rate_limit, rate: 1/s, on_store_error: allow } }\n" + minimalRoute)
            == ["portico.yaml:1 middleware.l.on_store_error: applies only with store: NAME (a shared store)"])
        let found = diagnostics("""
            stores: { fleet: { type: redis, url: "redis://h" } }
            middleware: { l: { type: rate_limit, rate: 1/s, store: fleet, on_store_error: open } }

            """ + minimalRoute)
        #expect(found == ["portico.yaml:2 middleware.l.on_store_error: expected one of local, allow, deny, got \"open\""])
    }

    @Test("long keys shorten to the same hash in every process when the store is shared")
    func stableKeys() {
        let request = RetryFixture.request(headers: [("X-API-Key", String(repeating: "x", count: 300))])
        let key = RateLimitMiddleware.key(for: request, parts: [.header("x-api-key")], route: nil, stableHash: true)
        // 64-bit FNV-1a of the whole key, computed independently: no per-process seed.
        #expect(key == String(repeating: "x", count: 64) + "\u{0}#e78ddf9f1ba85555:300")
    }
}
