@testable import RedisClient
import Testing

@Suite("Redis URLs and scripts")
struct RedisConfigurationTests {
    @Test("redis:// URLs: host, port, database, user and password")
    func urls() throws {
        let plain = try RedisConfiguration(url: "redis://cache.internal")
        #expect(plain.host == "cache.internal" && plain.port == 6379 && plain.database == 0)
        #expect(plain.username == nil && plain.password == nil && plain.tls == nil)

        let full = try RedisConfiguration(url: "redis://app:p%40ss%3Aw@10.0.0.5:6380/3")
        #expect(full.host == "10.0.0.5" && full.port == 6380 && full.database == 3)
        #expect(full.username == "app" && full.password == "p@ss:w")

        let passwordOnly = try RedisConfiguration(url: "redis://:secret@h/1")
        #expect(passwordOnly.username == nil && passwordOnly.password == "secret")
        let userOnly = try RedisConfiguration(url: "redis://limiter@h")
        #expect(userOnly.username == "limiter" && userOnly.password == nil)

        let tls = try RedisConfiguration(url: "rediss://[::1]:7000")
        #expect(tls.host == "::1" && tls.port == 7000 && tls.tls != nil)
    }

    @Test("invalid URLs say what is wrong", arguments: [
        "http://h", "redis://", "redis://h:0", "redis://h:99999", "redis://h:x", "redis://h/db", "redis://h/-1",
        "redis://u:%zz@h", "redis://[::1", "redis://h?x=1",
    ])
    func invalid(_ url: String) {
        #expect(throws: RedisConfiguration.URLError.self) { try RedisConfiguration(url: url) }
    }

    @Test("the description never shows the password")
    func description() throws {
        let configuration = try RedisConfiguration(url: "rediss://app:hunter2@h:1/2")
        #expect(configuration.description == "rediss://app@h:1/2")
        #expect(!"\(configuration)".contains("hunter2"))
    }

    @Test("SHA-1 of scripts matches the FIPS test vectors")
    func sha1() {
        #expect(RedisScript("").sha1 == "da39a3ee5e6b4b0d3255bfef95601890afd80709")
        #expect(RedisScript("abc").sha1 == "a9993e364706816aba3e25717850c26c9cd0d89d")
        #expect(RedisScript("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq").sha1
                == "84983e441c3bd26ebaae4aa1f95129e5e54670f1")
    }

    @Test("backoff waits are random, grow with failures, and stop at the cap")
    func backoff() throws {
        var configuration = RedisConfiguration(host: "127.0.0.1")
        configuration.backoffBase = .milliseconds(10)
        configuration.backoffCap = .milliseconds(300)
        let pool = try RedisConnectionPool(configuration: configuration)
        for failures in [1, 2, 3, 10, 1000] {
            let ceiling = Int64(min(300, 10 << min(failures - 1, 20)))
            let waits = (0..<200).map { _ in pool.backoff(afterFailures: failures).nanoseconds / 1_000_000 }
            #expect(waits.allSatisfy { $0 >= 0 && $0 <= ceiling })
            #expect(Set(waits).count > 1)
        }
    }
}
