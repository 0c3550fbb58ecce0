import Foundation
import Logging
import Portico
import PorticoTesting
import RedisClient
import Testing

/// Rate limits shared by every replica through a real `redis-server` the tests start
/// themselves on a free loopback port.
@Suite("Shared rate limits on Redis", .serialized, .enabled(if: RedisServer.available, "redis-server is not installed"))
struct SharedRateLimitTests {
    static func yaml(redis: String, password: String? = nil, timeout: String = "2s", rate: String, burst: Int,
                     extra: String = "") -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: 2 }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        stores:
          fleet:
            type: redis
            url: "\(redis)"
            timeout: \(timeout)
            connect_timeout: 20s
        \(password.map { "    password: \"\($0)\"" } ?? "")
        \(extra)
        middleware:
          shared: { type: rate_limit, key: route, rate: \(rate), burst: \(burst), store: fleet }
          unshared: { type: rate_limit, key: route, rate: \(rate), burst: \(burst) }
          allow: { type: rate_limit, key: route, rate: \(rate), burst: \(burst), store: fleet, on_store_error: allow }
          deny: { type: rate_limit, key: route, rate: \(rate), burst: \(burst), store: fleet, on_store_error: deny }
          probe: { type: rate_limit, key: route, rate: 10/m, burst: 10, store: fleet }
        routes:
          - { name: shared, match: { path: /shared }, direct: { body: "ok\\n" }, middleware: [shared] }
          - { name: unshared, match: { path: /unshared }, direct: { body: "ok\\n" }, middleware: [unshared] }
          - { name: allow, match: { path: /allow }, direct: { body: "ok\\n" }, middleware: [allow] }
          - { name: deny, match: { path: /deny }, direct: { body: "ok\\n" }, middleware: [deny] }
          - { name: probe, match: { path: /probe }, direct: { body: "ok\\n" }, middleware: [probe] }
        """
    }

    /// What a loaded 2-core machine may add to a request's time. Generous, yet far below what a
    /// request held hostage by a stalled Redis would wait (the 30 s request timeout).
    static let slack = Duration.seconds(5)

    static func get(_ port: Int, _ path: String) async throws -> RawHTTPResponse {
        let connection = try RawHTTPConnection(port: port, timeout: .seconds(30))
        try await connection.send("GET \(path) HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        return try #require(try await connection.readResponse(), "no answer on \(port)")
    }

    /// The shared bucket's tokens now, on Redis' clock (seconds): a missing key is a full bucket.
    static func bucket(_ pool: RedisConnectionPool, rate: Int, burst: Int) async throws -> (tokens: Double, time: Double) {
        let state = try await pool.pipeline([["HMGET", "portico:shared:shared", "tokens", "time"], ["TIME"]])
        let stored = state[0].array?.compactMap { $0.string.flatMap(Double.init) } ?? []
        let clock = state[1].array?.compactMap { $0.string.flatMap(Double.init) } ?? []
        try #require(clock.count == 2, "TIME \(state)")
        let now = clock[0] + clock[1] / 1e6
        guard stored.count == 2 else { return (Double(burst), now) }
        return (min(Double(burst), stored[0] + (now - stored[1] / 1e6) * Double(rate)), now)
    }

    /// `RateLimit` after a second request on a rested `probe` bucket (10/m, burst 10): 8 left, and
    /// 7 to 12 s until full (12 at once; less as the time between the two requests refills it).
    static func expectSecondProbe(_ header: String?, sourceLocation: SourceLocation = #_sourceLocation) {
        let t = header.flatMap { value in value.hasPrefix("\"probe\";r=8;t=") ? Int(value.dropFirst("\"probe\";r=8;t=".count)) : nil }
        #expect(t.map { (7...12).contains($0) } == true, "RateLimit: \(header ?? "none")", sourceLocation: sourceLocation)
    }

    static func dbSize(_ server: RedisServer) async throws -> Int64 {
        let pool = try RedisConnectionPool(configuration: server.configuration())
        defer { Task { await pool.shutdown() } }
        return try await pool.send(["DBSIZE"]).int ?? -1
    }

    @Test("three replicas share one limit under overload: the fleet accepts the configured rate, ±5 %")
    func threeReplicas() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        // A burst of three seconds: a replica stalled for a moment on a loaded machine loses no
        // tokens to a full bucket, so what is measured is the sharing.
        let rate = 100, burst = 300
        let config = Self.yaml(redis: redis.url, rate: "\(rate)/s", burst: burst)
        var replicas: [ProxyProcess] = []
        defer { replicas.forEach { $0.stop() } }
        for index in 0..<3 { replicas.append(try await ProxyProcess.portico(yaml: config, name: "replica\(index)")) }

        // One bucket for all: the second replica sees the token the first one took, in the
        // headers computed from what Redis returned (`probe`: 10/m, burst 10).
        let first = try await Self.get(replicas[0].port, "/probe")
        let second = try await Self.get(replicas[1].port, "/probe")
        #expect(first.header("ratelimit") == "\"probe\";r=9;t=6")
        Self.expectSecondProbe(second.header("ratelimit"))
        #expect(first.header("ratelimit-policy") == "\"probe\";q=10;w=60")

        // Overload for a second to empty the shared bucket, then count over a window what the
        // fleet accepted against what the configured rate allows: the tokens in the bucket at the
        // start, plus `rate` × the time elapsed on Redis' clock, less the tokens left at the end.
        let pool = try RedisConnectionPool(configuration: redis.configuration())
        // Every key has a TTL of its refill time: the probe's, 12 s for two tokens at 10/m.
        let probeTTL = try await pool.send(["PTTL", "portico:probe:probe"]).int ?? -1
        #expect(probeTTL > 0 && probeTTL <= 12_000, "PTTL \(probeTTL)")
        _ = try await pool.send(["DEL", "portico:probe:probe"])
        var before = try await Self.bucket(pool, rate: rate, burst: burst)
        for _ in 0..<10 where before.tokens > Double(burst) / 2 {
            _ = await RequestFlood.run(ports: replicas.map(\.port), path: "/shared", connections: 3, duration: .seconds(1))
            before = try await Self.bucket(pool, rate: rate, burst: burst)
        }
        try #require(before.tokens <= Double(burst) / 2, "the bucket would not drain: \(before.tokens) tokens")
        let outcomes = await RequestFlood.run(ports: replicas.map(\.port), path: "/shared", connections: 3, duration: .seconds(4))
        let after = try await Self.bucket(pool, rate: rate, burst: burst)
        let seconds = after.time - before.time
        let accepted = outcomes.map { $0.count(200) }.reduce(0, +)
        let offered = outcomes.map(\.total).reduce(0, +)
        let expected = before.tokens + Double(rate) * seconds - after.tokens
        let comment = Comment(rawValue: "accepted \(accepted) of \(offered) in \(seconds) s, expected \(expected) "
            + "(\(before.tokens) tokens at the start, \(after.tokens) at the end); per replica \(outcomes.map { $0.count(200) })")
        #expect(Double(offered) > 2 * Double(rate) * seconds, "not an overload: \(comment)")
        #expect(abs(Double(accepted) - expected) <= 0.05 * expected, comment)
        #expect(outcomes.allSatisfy { $0.count(200) > 0 }, comment)
        #expect(outcomes.allSatisfy { Set($0.statuses.keys).isSubset(of: [200, 429]) }, comment)

        // Contrast: the same limit kept per replica lets each replica through at the full rate.
        let unshared = await RequestFlood.run(ports: replicas.map(\.port), path: "/unshared", connections: 3, duration: .seconds(3))
        let unsharedSeconds = Double(unshared[0].elapsed.components.seconds) + Double(unshared[0].elapsed.components.attoseconds) / 1e18
        let unsharedAccepted = unshared.map { $0.count(200) }.reduce(0, +)
        let oneBucket = Double(rate) * unsharedSeconds + Double(burst)
        #expect(Double(unsharedAccepted) > 1.5 * oneBucket, "unshared accepted \(unsharedAccepted) in \(unsharedSeconds) s")

        // Every key expires once its bucket would be full again: Redis holds only active keys.
        await pool.shutdown()
        try await Eventually.wait(timeout: .seconds(20), "the buckets to expire") {
            (try? await Self.dbSize(redis)) == 0
        }
    }

    @Test("Redis stalled or killed mid-load: no request waits past the timeout, each on_store_error is honoured, errors are counted; sharing resumes when it returns")
    func outage() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        // 1/m: a bucket's key lives a minute after one request, and the local fallback's count is its burst.
        let burst = 2
        let gateway = try await ProxyProcess.portico(yaml: Self.yaml(redis: redis.url, timeout: "100ms", rate: "1/m", burst: burst))
        defer { gateway.stop() }
        // Up: every route keeps its bucket in Redis (a request that waited longer than the timeout
        // for the first connection was answered locally, so ask until all three keys are there).
        try await Eventually.wait(timeout: .seconds(30), "a bucket in Redis for each route") {
            for path in ["/shared", "/allow", "/deny"] { _ = try? await Self.get(gateway.port, path) }
            return (try? await Self.dbSize(redis)) == 3
        }
        #expect(try await gateway.metric("portico_ratelimit_store_duration_seconds_count") >= 3)

        // Stalled: connections stay open but nothing answers, so each request waits for the timeout.
        redis.pause()
        let stalled = await RequestFlood.run(ports: [gateway.port], path: "/allow", connections: 2, duration: .seconds(1))
        redis.resume()
        #expect(stalled[0].count(200) == stalled[0].total && stalled[0].total > 0, "allow lets everything through: \(stalled[0].statuses)")
        #expect(stalled[0].slowest < .milliseconds(100) + Self.slack, "slowest \(stalled[0].slowest)")

        // Killed: refused at once, then failed without I/O while the pool backs off.
        await redis.kill()
        let modes = await RequestFlood.run(ports: [gateway.port], path: "/allow", connections: 2, duration: .seconds(1))[0]
        #expect(modes.count(200) == modes.total && modes.total > 0, "allow: \(modes.statuses)")
        let denied = await RequestFlood.run(ports: [gateway.port], path: "/deny", connections: 2, duration: .seconds(1))[0]
        #expect(denied.count(429) == denied.total && denied.total > 0, "deny: \(denied.statuses)")
        let local = await RequestFlood.run(ports: [gateway.port], path: "/shared", connections: 2, duration: .seconds(1))[0]
        let localSeconds = Double(local.elapsed.components.seconds) + Double(local.elapsed.components.attoseconds) / 1e18
        // local: this process's own bucket at the same rate — neither open nor shut.
        #expect(local.count(200) >= 1 && Double(local.count(200)) <= localSeconds / 60 + Double(burst) + 1,
                "local: \(local.statuses) in \(localSeconds) s, \(local.failures) connections failed")
        #expect(local.count(429) > 0)
        for outcome in [modes, denied, local] {
            #expect(outcome.slowest < .milliseconds(100) + Self.slack, "slowest \(outcome.slowest)")
        }
        #expect(try await gateway.metric("portico_ratelimit_store_errors_total") >= Double(stalled[0].total + denied.total))
        #expect(gateway.isRunning)
        // Readiness does not depend on Redis: the fallback serves.
        #expect(try await Self.get(try #require(gateway.adminPort), "/readyz").status == 200)

        // Back: shared limiting resumes by itself (the pool reconnects on the next request).
        try await redis.launch()
        let back = ContinuousClock.now
        try await Eventually.wait(timeout: .seconds(20), "Redis to be used again") {
            // `deny` answers 200 only with Redis deciding.
            (try? await Self.get(gateway.port, "/deny"))?.status == 200
        }
        let resumedAfter = back.duration(to: .now)
        #expect(resumedAfter < .seconds(10), "resumed after \(resumedAfter)")
        try await Eventually.wait(timeout: .seconds(20), "a bucket in Redis") {
            _ = try? await Self.get(gateway.port, "/shared")
            return (try? await Self.dbSize(redis)) ?? 0 > 0
        }
    }

    @Test("a wrong password, an unreachable server and an untrusted TLS certificate are clear errors in the log, without the password")
    func connectionErrors() async throws {
        let redis = try await RedisServer.start(password: "right-pw")
        defer { redis.stop() }
        let refusing = try RefusingPort()
        let certificates = try await TestCertificates.shared()
        let tlsRedis = try await RedisServer.start(tls: .init(certificateFile: certificates.server.certificateFile,
                                                             keyFile: certificates.server.keyFile,
                                                             caFile: certificates.ca.certificateFile))
        defer { tlsRedis.stop() }
        let cases: [(String, String?, String)] = [
            (redis.url, "wrong-pw", "auth"),
            ("redis://127.0.0.1:\(refusing.port)/0", nil, "unavailable"),
            (tlsRedis.url, nil, "tls"),
        ]
        for (url, password, kind) in cases {
            let capture = LogCapture(message: "rate limit store cannot connect")
            let config = try ConfigLoader.load(yaml: Self.yaml(redis: url, password: password, rate: "10/s", burst: 10), environment: [:])
            let gateway = try TestGateway(config, logger: capture.logger)
            try await Eventually.wait(timeout: .seconds(20), "the \(kind) error in the log") { !capture.records.isEmpty }
            let record = try #require(capture.records.first)
            #expect(record["kind"]?.description == kind, "\(record)")
            #expect(record["store"]?.description == "fleet")
            #expect(!record.description.contains("wrong-pw"))
            if kind == "auth" { #expect(record["error"]?.description.contains("WRONGPASS") == true, "\(record)") }
            // The fallback answers meanwhile (on_store_error: local).
            #expect(try await gateway.request("GET", "/shared").status == 200)
            await gateway.stop()
        }
    }

    @Test("on_limit: wait on Redis: two replicas' requests over the rate wait for slots the server hands out, and all are served")
    func fleetWaiting() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let config = try ConfigLoader.load(yaml: """
            listen: { address: 127.0.0.1, port: 0, threads: 2 }
            admin: { enabled: false }
            logging: { level: error }
            stores:
              fleet: { type: redis, url: "\(redis.url)", timeout: 2s, connect_timeout: 20s }
            middleware:
              paced: { type: rate_limit, key: route, rate: 5/s, burst: 1, on_limit: wait, max_wait: 10s, store: fleet }
            routes:
              - { name: paced, match: { path: /paced }, direct: { body: "ok\\n" }, middleware: [paced] }
            """, environment: [:])
        let one = try TestGateway(config), two = try TestGateway(config)
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<8 {
                let gateway = index.isMultiple(of: 2) ? one : two
                group.addTask { try await gateway.request("GET", "/paced").status }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(statuses == Array(repeating: 200, count: 8))
        // The slots came from the server's GCRA key (`:w:`): it is there until the bucket is full
        // again, and then it has expired (a loaded machine may ask after that).
        let pool = try RedisConnectionPool(configuration: redis.configuration())
        let replies = try await pool.pipeline([["PTTL", "portico:paced:w:paced"], ["INFO", "stats"]])
        let ttl = replies.first?.int ?? -2
        let expired = replies.last?.string?.split(whereSeparator: \.isNewline)
            .first { $0.hasPrefix("expired_keys:") }.flatMap { Int($0.dropFirst("expired_keys:".count)) } ?? 0
        #expect(ttl > 0 || expired > 0, "no GCRA key: the waits did not go through the store")
        #expect(try await pool.pipeline([["EXISTS", "portico:paced:paced"]]).first?.int == 0,
                "the token-bucket key of on_limit: reject was used")
        await pool.shutdown()
        await one.stop()
        await two.stop()
    }

    @Test("rediss:// with the CA in tls.ca_file: buckets are shared over TLS")
    func tls() async throws {
        let certificates = try await TestCertificates.shared()
        let redis = try await RedisServer.start(tls: .init(certificateFile: certificates.server.certificateFile,
                                                          keyFile: certificates.server.keyFile,
                                                          caFile: certificates.ca.certificateFile))
        defer { redis.stop() }
        let extra = "    tls: { ca_file: \"\(certificates.ca.certificateFile)\" }"
        let config = try ConfigLoader.load(yaml: Self.yaml(redis: redis.url, rate: "10/s", burst: 10, extra: extra), environment: [:])
        let one = try TestGateway(config), two = try TestGateway(config)
        #expect(try await one.request("GET", "/probe").header("ratelimit") == "\"probe\";r=9;t=6")
        Self.expectSecondProbe(try await two.request("GET", "/probe").header("ratelimit"))
        await one.stop()
        await two.stop()
    }

    @Test("a reload with the same store keeps its connections; a changed store gets new ones and the old close")
    func reload() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        var config = try ConfigLoader.load(yaml: Self.yaml(redis: redis.url, rate: "10/s", burst: 10), environment: [:])
        // A replaced runtime is shut down this long (+ 1 s) after a reload, once its requests are done.
        config.listen.requestTimeout = .seconds(2)
        let gateway = try TestGateway(config)
        #expect(try await gateway.request("GET", "/probe").header("ratelimit") == "\"probe\";r=9;t=6")
        let before = try #require(gateway.server.gateway.current.stores.backend(named: "fleet"))
        var same = config
        same.routes.append(RouteConfig(name: "extra", match: .init(path: "/extra"), direct: .init(body: "x")))
        try gateway.server.reload(same)
        #expect(gateway.server.gateway.current.stores.backend(named: "fleet") === before)
        Self.expectSecondProbe(try await gateway.request("GET", "/probe").header("ratelimit"))

        var changed = config
        changed.stores["fleet"]?.keyPrefix = "other:"
        try gateway.server.reload(changed)
        let after = try #require(gateway.server.gateway.current.stores.backend(named: "fleet"))
        #expect(after !== before)
        // The replaced client closes once the old runtime is done.
        try await Eventually.wait(timeout: .seconds(30), "the old store's connections to close") { before.openConnections == 0 }
        #expect(try await gateway.request("GET", "/probe").header("ratelimit") == "\"probe\";r=9;t=6", "a new key space")
        await gateway.stop()
    }
}
