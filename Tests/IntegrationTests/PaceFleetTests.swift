import Foundation
import Portico
import PorticoTesting
import Testing

/// Issue #41 across a fleet: three Portico processes on one `redis-server` in front of one
/// provider stand-in; what one replica learns holds every replica.
@Suite("Pace: provider limits shared by three replicas on Redis", .serialized,
       .enabled(if: RedisServer.available, "redis-server is not installed"))
struct PaceFleetTests {
    static func yaml(redis: String, provider: RateLimitedProvider) -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: 2, request_timeout: 30s }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        stores:
          fleet: { type: redis, url: "\(redis)", timeout: 2s, connect_timeout: 20s }
        upstreams:
          vendor:
            url: "\(provider.upstream.baseURL.absoluteString)"
            transport: nio
            provider_limits: { scope: "header:x-api-key", when_exhausted: wait, max_wait: 15s, store: fleet }
        routes:
          - { name: api, match: { path_prefix: /api/ }, upstream: vendor, middleware: [] }
        """
    }

    static func get(_ port: Int, key: String) async throws -> Int {
        let connection = try RawHTTPConnection(port: port, timeout: .seconds(30))
        try await connection.send("GET /api/item HTTP/1.1\r\nHost: t\r\nX-API-Key: \(key)\r\nConnection: close\r\n\r\n")
        return try #require(try await connection.readResponse(), "no answer on \(port)").status
    }

    /// `perReplica` requests through each replica, two at a time on each.
    static func offer(_ replicas: [ProxyProcess], perReplica: Int, key: String) async throws -> [Int] {
        try await withThrowingTaskGroup(of: [Int].self) { group in
            for replica in replicas {
                for lane in 0..<2 {
                    group.addTask {
                        var statuses: [Int] = []
                        for _ in stride(from: lane, to: perReplica, by: 2) { statuses.append(try await get(replica.port, key: key)) }
                        return statuses
                    }
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }

    static func fleet(_ yaml: String) async throws -> [ProxyProcess] {
        try await ProxyProcess.fleet(yaml: yaml)
    }

    @Test("the provider's remaining count is spent fleet-wide: three replicas forward nothing it refuses, and every caller is served")
    func sharedBudget() async throws {
        let provider = RateLimitedProvider(limit: 8, window: .seconds(1), form: .ietf)
        try await provider.start()
        defer { Task { await provider.shutdown() } }
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let replicas = try await Self.fleet(Self.yaml(redis: redis.url, provider: provider))
        defer { replicas.forEach { $0.stop() } }

        // One answer teaches the fleet the budget; then 36 requests, 12 through each replica.
        #expect(try await Self.get(replicas[0].port, key: "team-a") == 200)
        let statuses = try await Self.offer(replicas, perReplica: 12, key: "team-a")
        // Replicas correct the shared count with answers still on their way: the goal is
        // at most 1 % refused over a long run; here at most one of 37 (without sharing: a dozen).
        #expect(provider.counts.refused <= 1, "the provider refused \(provider.counts.refused) of \(provider.counts.served + provider.counts.refused)")
        #expect(statuses.filter { $0 != 200 }.count <= provider.counts.refused, "statuses \(statuses)")
        #expect(provider.counts.served + provider.counts.refused == 37)
    }

    @Test("a Retry-After one replica receives pauses every replica: nothing reaches the provider during the hold")
    func sharedHold() async throws {
        let provider = RateLimitedProvider(limit: 4, window: .seconds(1), form: .retryAfterOnly)
        try await provider.start()
        defer { Task { await provider.shutdown() } }
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let replicas = try await Self.fleet(Self.yaml(redis: redis.url, provider: provider))
        defer { replicas.forEach { $0.stop() } }

        let statuses = try await Self.offer(replicas, perReplica: 8, key: "k")
        #expect(provider.counts.duringHold == 0, "\(provider.counts.duringHold) requests reached the provider during a hold it announced")
        #expect(provider.counts.refused >= 1, "the provider never refused: the test did not exercise a hold")
        #expect(statuses.filter { $0 == 200 }.count == provider.counts.served)
    }
}
