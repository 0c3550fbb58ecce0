import Foundation
import Logging
import Portico
import PorticoTesting
import RedisClient
import Testing

/// Quotas on a real `redis-server` the tests start themselves on a free loopback port: the count
/// outlives every replica, allocations hold, the window resets on the injected clock, an outage
/// is made good when Redis returns, and /metrics shows refusals and usage per allocation.
@Suite("Quotas on Redis", .serialized, .enabled(if: RedisServer.available, "redis-server is not installed"))
struct QuotaTests {
    static func yaml(redis: String, timeout: String = "10s", limit: Int = 20, per: String = "day") -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: 2 }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        stores:
          fleet: { type: redis, url: "\(redis)", timeout: \(timeout), connect_timeout: 20s }
        middleware:
          teams:
            type: quota
            key: header:X-Team
            limit: \(limit)
            per: \(per)
            allocations: { team-a: 50%, team-b: 30% }
            store: fleet
          closed:
            type: quota
            key: header:X-Team
            limit: 10
            per: \(per)
            allocations: { team-a: 60%, default: 0% }
            store: fleet
        routes:
          - { name: teams, match: { path: /teams }, direct: { body: "ok\\n" }, middleware: [teams] }
          - { name: closed, match: { path: /closed }, direct: { body: "ok\\n" }, middleware: [closed] }
        """
    }

    static func gateway(_ redis: RedisServer, clock: ManualClock, timeout: String = "10s", limit: Int = 20) throws -> TestGateway {
        try TestGateway(try ConfigLoader.load(yaml: yaml(redis: redis.url, timeout: timeout, limit: limit), environment: [:]),
                        clock: clock)
    }

    static func send(_ gateway: TestGateway, _ path: String = "/teams", team: String?) async throws -> RawHTTPResponse {
        try await gateway.request("GET", path, headers: team.map { [("X-Team", $0)] } ?? [])
    }

    /// Requests of `team` answered 200 before the first 429 (at most `cap`), spread over `gateways` in turn.
    static func served(_ gateways: [TestGateway], _ path: String = "/teams", team: String?, cap: Int = 40) async throws -> Int {
        for count in 0..<cap {
            let response = try await send(gateways[count % gateways.count], path, team: team)
            if response.status == 429 { return count }
            try #require(response.status == 200, "status \(response.status)")
        }
        return cap
    }

    static func redisCount(_ pool: RedisConnectionPool, _ key: String) async throws -> Int64? {
        try await pool.send(["GET", .string(key)]).string.flatMap(Int64.init)
    }

    @Test("a quota survives a restart of every replica, its allocations hold, and it resets at the window's start (injected clock)")
    func restartAllocationsReset() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        // 2025-06-15T15:06:40Z: 32000 s before the day ends.
        let clock = ManualClock(wallNow: Date(timeIntervalSince1970: 1_750_000_000))
        let pool = try RedisConnectionPool(configuration: redis.configuration())
        defer { Task { await pool.shutdown() } }

        // Two replicas share team-a's 10 (50 % of 20).
        var replicas = [try Self.gateway(redis, clock: clock), try Self.gateway(redis, clock: clock)]
        for index in 0..<7 {
            let response = try await Self.send(replicas[index % 2], team: "team-a")
            #expect(response.status == 200)
            #expect(response.header("ratelimit") == "\"teams\";r=\(9 - index);t=32000", "request \(index)")
            #expect(response.header("ratelimit-policy") == "\"teams\";q=10;w=86400")
        }
        for replica in replicas { await replica.stop() }
        #expect(try await Self.redisCount(pool, "portico:teams:day:20250615T0000Z:team-a") == 7)
        let ttl = try await pool.send(["PTTL", "portico:teams:day:20250615T0000Z:team-a"]).int ?? -1
        #expect(ttl > 32_000_000 && ttl <= 35_600_000, "PTTL \(ttl): the window's end and an hour")

        // Every replica gone; a new one goes on from 7.
        replicas = [try Self.gateway(redis, clock: clock)]
        #expect(try await Self.served(replicas, team: "team-a") == 3)
        let refused = try await Self.send(replicas[0], team: "team-a")
        #expect(refused.status == 429)
        #expect(refused.header("retry-after") == "32000")
        #expect(refused.header("ratelimit") == "\"teams\";r=0;t=32000")
        #expect(refused.bodyText.contains("\"error\":\"quota_exhausted\""), "\(refused.bodyText)")

        // team-b its 6; every other key and the keyless requests one pool of the 4 left.
        replicas.append(try Self.gateway(redis, clock: clock))
        #expect(try await Self.served(replicas, team: "team-b") == 6)
        #expect(try await Self.served(replicas, team: "team-c", cap: 2) == 2)
        #expect(try await Self.served(replicas, team: nil, cap: 1) == 1)
        #expect(try await Self.served(replicas, team: "team-d") == 1)
        #expect(try await Self.redisCount(pool, "portico:teams:day:20250615T0000Z:default") == 4)
        // The raw key values never reach Redis: one count per allocation.
        let keys = try await pool.send(["KEYS", "portico:teams:*"]).array?.compactMap(\.string).sorted()
        #expect(keys == ["portico:teams:day:20250615T0000Z:default", "portico:teams:day:20250615T0000Z:team-a",
                         "portico:teams:day:20250615T0000Z:team-b"])

        // default: 0% refuses unlisted keys, without a Retry-After; the listed key passes.
        let stranger = try await Self.send(replicas[0], "/closed", team: "team-z")
        #expect(stranger.status == 429 && stranger.header("retry-after") == nil)
        #expect(try await Self.send(replicas[1], "/closed", team: "team-a").status == 200)

        // Midnight UTC: a new window, whole again, on both replicas.
        clock.advance(by: .seconds(32_000))
        let fresh = try await Self.send(replicas[1], team: "team-a")
        #expect(fresh.status == 200)
        #expect(fresh.header("ratelimit") == "\"teams\";r=9;t=86400")
        #expect(try await Self.served(replicas, team: "team-b") == 6)
        #expect(try await Self.redisCount(pool, "portico:teams:day:20250616T0000Z:team-a") == 1)
        for replica in replicas { await replica.stop() }
    }

    @Test("Redis killed: on_store_error local counts on, no request waits past the timeout; what was served is added when Redis returns")
    func outage() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let clock = ManualClock(wallNow: Date(timeIntervalSince1970: 1_750_000_000))
        // A refused connection fails at once; the timeout only has to be long enough never to give
        // up on a command Redis then runs anyway (which would count it twice).
        let gateway = try Self.gateway(redis, clock: clock, timeout: "10s", limit: 200)
        defer { Task { await gateway.stop() } }
        let key = "portico:teams:day:20250615T0000Z:team-a"
        let pool = try RedisConnectionPool(configuration: redis.configuration())
        defer { Task { await pool.shutdown() } }
        // Up: counted in Redis (a first request slower than the timeout to connect is counted
        // locally and added with the next, so ask until Redis has them all).
        var sent = 0
        let deadline = ContinuousClock.now.advanced(by: .seconds(30))
        repeat {
            sent += 1
            _ = try await Self.send(gateway, team: "team-a")
        } while try await Self.redisCount(pool, key) != Int64(sent) && ContinuousClock.now < deadline
        try #require(try await Self.redisCount(pool, key) == Int64(sent), "Redis counts \(sent) requests")

        await redis.kill()
        let start = ContinuousClock.now
        var during = 0
        for _ in 0..<5 {
            let response = try await Self.send(gateway, team: "team-a")
            #expect(response.status == 200)
            #expect(response.header("ratelimit") == "\"teams\";r=\(100 - sent - during - 1);t=32000")
            during += 1
        }
        let elapsed = start.duration(to: .now)
        #expect(elapsed < .seconds(2) * during, "\(during) requests took \(elapsed): none waits for the timeout")

        // Back (empty: the test's Redis keeps nothing on disk): the first call that reaches it
        // brings what this replica served meanwhile.
        try await redis.launch()
        var after = 0
        let back = ContinuousClock.now.advanced(by: .seconds(30))
        repeat {
            after += 1
            #expect(try await Self.send(gateway, team: "team-a").status == 200)
        } while try await Self.redisCount(pool, key) == nil && ContinuousClock.now < back
        #expect(try await Self.redisCount(pool, key) == Int64(during + after), "\(during) served during the outage, \(after) after")
    }

    @Test("refusals and usage per allocation are in /metrics, labelled by allocation, never by a key's value")
    func metrics() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let gateway = try await ProxyProcess.portico(yaml: Self.yaml(redis: redis.url, limit: 10, per: "month"))
        defer { gateway.stop() }
        func get(_ team: String) async throws -> Int {
            let connection = try RawHTTPConnection(port: gateway.port, timeout: .seconds(30))
            try await connection.send("GET /teams HTTP/1.1\r\nHost: t\r\nX-Team: \(team)\r\nConnection: close\r\n\r\n")
            return try #require(try await connection.readResponse()).status
        }
        // team-a: 5; the pool (2) for a secret-looking key.
        for _ in 0..<6 { _ = try await get("team-a") }
        for _ in 0..<3 { _ = try await get("sk-secret-123") }
        let connection = try RawHTTPConnection(port: try #require(gateway.adminPort), timeout: .seconds(10))
        try await connection.send("GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
        let text = try #require(try await connection.readResponse()).bodyText
        let lines = text.split(separator: "\n").filter { $0.hasPrefix("portico_quota_") }.map(String.init)
        func value(_ prefix: String) -> Double? {
            lines.first { $0.hasPrefix(prefix) }.flatMap { $0.split(separator: " ").last.flatMap { Double($0) } }
        }
        #expect(value("portico_quota_rejected_total{middleware=\"teams\",allocation=\"team-a\"}")
            ?? value("portico_quota_rejected_total{allocation=\"team-a\",middleware=\"teams\"}") == 1, "\(lines)")
        #expect(value("portico_quota_rejected_total{middleware=\"teams\",allocation=\"default\"}")
            ?? value("portico_quota_rejected_total{allocation=\"default\",middleware=\"teams\"}") == 1, "\(lines)")
        func gauge(_ name: String, _ allocation: String) -> Double? {
            lines.first { $0.hasPrefix(name + "{") && $0.contains("middleware=\"teams\"") && $0.contains("allocation=\"\(allocation)\"") }
                .flatMap { $0.split(separator: " ").last.flatMap { Double($0) } }
        }
        // Among the gateway's 429s by reason too, beside the rate limiters' own.
        let refusals = text.split(separator: "\n").filter { $0.hasPrefix("portico_ratelimit_rejected_total{") }
        #expect(refusals.contains { $0.contains("route=\"teams\"") && $0.contains("reason=\"quota\"") && $0.hasSuffix(" 2") },
                "\(refusals)")
        #expect(gauge("portico_quota_used", "team-a") == 5, "\(lines)")
        #expect(gauge("portico_quota_limit", "default") == 2, "\(lines)")
        #expect(gauge("portico_quota_limit", "team-b") == 3, "\(lines)")
        #expect(!text.contains("sk-secret-123"))
    }
}
