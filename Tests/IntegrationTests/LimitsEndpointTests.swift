import Foundation
import Logging
import Portico
import PorticoTesting
import Testing

/// `GET /limits` (issue #41, visibility) against a real gateway with all three limits — a waiting
/// rate limit, a provider's learned budget and a quota on a real redis-server — read while a
/// request waits for its token, field by field. The gateway runs on the injected clock: the
/// waiting request goes when the test moves time, never by a sleep.
@Suite("Admin /limits: rate limits, provider budgets, quotas", .serialized,
       .enabled(if: RedisServer.available, "redis-server is not installed"))
struct LimitsEndpointTests {
    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    static func yaml(redis: String, provider: String) -> String {
        """
        listen: { address: 127.0.0.1, port: 0, request_timeout: 60s }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: error }
        stores:
          fleet: { type: redis, url: "\(redis)", timeout: 10s, connect_timeout: 20s }
        upstreams:
          vendor:
            url: "\(provider)"
            transport: nio
            provider_limits: { scope: "header:x-api-key", when_exhausted: wait, max_wait: 7s }
        middleware:
          pace: { type: rate_limit, key: route, rate: 1/s, burst: 2, on_limit: wait, max_wait: 30s, max_waiting: 5 }
          teams:
            type: quota
            key: header:X-Team
            limit: 4
            per: day
            allocations: { team-a: 50% }
            store: fleet
        routes:
          - { name: api, match: { path_prefix: /api/ }, upstream: vendor, middleware: [pace, teams] }
        """
    }

    /// 64-bit FNV-1a in hex: how the report names a header scope (never the value itself).
    static func hashed(_ text: String) -> String {
        let hash = text.utf8.reduce(UInt64(0xCBF2_9CE4_8422_2325)) { ($0 ^ UInt64($1)) &* 0x0000_0100_0000_01B3 }
        return "#" + String(hash, radix: 16)
    }

    @Test("GET /limits shows each rate limit with who waits now, each provider scope's learned budget (hashed), each quota's allocations")
    func limitsReport() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let provider = RateLimitedProvider(limit: 50, window: .seconds(60), clockOffset: RateLimitedProvider.offsetToFreshWindow(.seconds(60)))
        try await provider.start()
        // 2025-06-15T15:06:40Z: 32000 s before the UTC day ends.
        let clock = ManualClock(wallNow: Date(timeIntervalSince1970: 1_750_000_000))
        let config = try ConfigLoader.load(yaml: Self.yaml(redis: redis.url, provider: provider.upstream.baseURL.absoluteString),
                                           environment: [:])
        let gateway = try TestGateway(config, clock: clock)
        let admin = AdminServer(config: config.admin, gateway: gateway.server, logger: Self.logger, metricsText: { [] })
        try admin.start()
        defer { Task { await admin.stop() } }

        func limits() async throws -> [String: Any] {
            let connection = try RawHTTPConnection(port: Int(admin.port))
            try await connection.send("GET /limits HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            let response = try #require(try await connection.readResponse())
            #expect(response.status == 200 && response.header("content-type") == "application/json")
            #expect(!response.bodyText.contains("key-1"), "a header scope's value is never shown")
            return try #require(try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])
        }
        let headers = [("X-Team", "team-a"), ("X-API-Key", "key-1")]
        for _ in 0..<2 { #expect(try await gateway.request("GET", "/api/item", headers: headers).status == 200) }

        // The bucket (burst 2) is empty: the third request waits for its token, a second away.
        let third = Task { try await gateway.request("GET", "/api/item", headers: headers) }
        var report: [String: Any] = [:]
        let deadline = ContinuousClock.now.advanced(by: .seconds(60))
        while true {
            report = try await limits()
            if (report["rate_limits"] as? [[String: Any]])?.first?["waiting"] as? Int == 1 { break }
            try #require(ContinuousClock.now < deadline, "the third request never waited: \(report)")
            try await Task.sleep(for: .milliseconds(10))   // polling, as Eventually does
        }

        let rates = try #require(report["rate_limits"] as? [[String: Any]])
        #expect(rates.count == 1)
        let pace = try #require(rates.first)
        #expect(pace["name"] as? String == "pace")
        #expect(pace["rate"] as? String == "1/s")
        #expect(pace["burst"] as? Int == 2)
        #expect(pace["on_limit"] as? String == "wait")
        #expect(pace["max_wait_seconds"] as? Double == 30)
        #expect(pace["max_waiting"] as? Int == 5)
        #expect(pace["store"] as? String == "local")

        let providers = try #require(report["provider_limits"] as? [[String: Any]])
        let vendor = try #require(providers.first)
        #expect(providers.count == 1)
        #expect(vendor["upstream"] as? String == "vendor")
        #expect(vendor["scope"] as? String == "header:x-api-key")
        #expect(vendor["when_exhausted"] as? String == "wait")
        #expect(vendor["max_wait_seconds"] as? Double == 7)
        #expect(vendor["store"] as? String == "local")
        let scopes = try #require(vendor["scopes"] as? [[String: Any]])
        let scope = try #require(scopes.first)
        #expect(scopes.count == 1)
        #expect(scope["scope"] as? String == Self.hashed("key-1"), "\(scope)")
        #expect(scope["remaining"] as? Int == 48, "two of the provider's 50 spent: \(scope)")
        #expect(scope["limit"] as? Int == 50, "\(scope)")
        let reset = try #require(scope["reset_seconds"] as? Double, "\(scope)")
        #expect(reset > 0 && reset <= 60, "the provider's window is a minute: \(reset)")
        #expect(scope["hold_seconds"] == nil, "the provider refused nothing: \(scope)")
        #expect(scope["in_flight"] as? Int == 0 && scope["waiting"] as? Int == 0, "the third waits at the rate limit, before: \(scope)")

        let quotas = try #require(report["quotas"] as? [[String: Any]])
        let teams = try #require(quotas.first)
        #expect(quotas.count == 1)
        #expect(teams["name"] as? String == "teams")
        #expect(teams["limit"] as? Int == 4)
        #expect(teams["per"] as? String == "day")
        #expect(teams["window_start"] as? String == "2025-06-15T00:00:00Z")
        #expect(teams["window_end"] as? String == "2025-06-16T00:00:00Z")
        #expect(teams["store"] as? String == "fleet")
        let allocations = try #require(teams["allocations"] as? [[String: Any]])
        #expect(allocations.map { $0["name"] as? String } == ["team-a", "default"])
        #expect(allocations.map { $0["limit"] as? Int } == [2, 2])
        #expect(allocations.map { $0["used"] as? Int } == [2, 0])
        #expect(allocations.map { $0["left"] as? Int } == [0, 2])

        // Time moves a second: the third takes its token, and team-a's quota refuses it. Both
        // limits' items are in its headers: the rate limit outside appended its own.
        clock.advance(by: .seconds(1))
        let refused = try await third.value
        #expect(refused.status == 429)
        #expect(refused.bodyText.contains("quota_exhausted"))
        let policy = try #require(refused.header("ratelimit-policy"))
        #expect(policy == "\"teams\";q=2;w=86400, \"pace\";q=2;w=2", "\(policy)")
        let state = try #require(refused.header("ratelimit"))
        #expect(state.hasPrefix("\"teams\";r=0;t=31999, \"pace\";r=0;t="), "\(state)")
        let after = try await limits()
        #expect((after["rate_limits"] as? [[String: Any]])?.first?["waiting"] as? Int == 0)
        #expect(provider.counts.served == 2, "the refused request never reached the provider")

        await gateway.stop()
        await provider.shutdown()
    }
}
