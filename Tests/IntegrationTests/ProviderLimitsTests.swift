import Foundation
import Portico
import PorticoTesting
import Synchronization
import Testing

/// Issue #41: Portico learns a provider's limit from its own headers and holds back what the
/// provider would refuse. Real gateway, real provider stand-in, real time (its windows are a
/// second long).
/// Hands out 0, 1, 2, … to any number of tasks.
final class StepCounter: Sendable {
    private let value = Atomic<Int>(0)
    func next() -> Int { value.wrappingAdd(1, ordering: .relaxed).oldValue }
}

@Suite("Provider limits: learned from the provider's headers, end to end")
struct ProviderLimitsTests {
    static func config(provider: RateLimitedProvider, whenExhausted: String = "wait", maxWait: String = "10s") throws -> PorticoConfig {
        try ConfigLoader.load(yaml: """
            listen: { address: 127.0.0.1, port: 0, request_timeout: 30s }
            admin: { enabled: false }
            logging: { level: error }
            upstreams:
              vendor:
                url: "\(provider.upstream.baseURL.absoluteString)"
                transport: nio
                provider_limits: { scope: "header:x-api-key", when_exhausted: \(whenExhausted), max_wait: \(maxWait) }
            routes:
              - { name: api, match: { path_prefix: /api/ }, upstream: vendor, middleware: [] }
            """, environment: [:])
    }

    /// `count` requests for `key`, `concurrency` at a time; the statuses in the order they were sent.
    static func offer(_ gateway: TestGateway, count: Int, concurrency: Int, key: String = "team-a") async throws -> [Int] {
        let next = StepCounter()
        return try await withThrowingTaskGroup(of: [Int].self) { group in
            for _ in 0..<concurrency {
                group.addTask {
                    var statuses: [Int] = []
                    while next.next() < count {
                        statuses.append(try await gateway.request("GET", "/api/item", headers: [("X-API-Key", key)]).status)
                    }
                    return statuses
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
    }

    @Test("a provider publishing what is left refuses nothing Portico forwards, and every caller is served",
          arguments: [RateLimitedProvider.Form.ietf, .xRateLimit(unixReset: false)])
    func publishedBudgetIsRespected(form: RateLimitedProvider.Form) async throws {
        let provider = RateLimitedProvider(limit: 5, window: .seconds(1), form: form)
        try await provider.start()
        defer { Task { await provider.shutdown() } }
        let gateway = try TestGateway(try Self.config(provider: provider))
        defer { Task { await gateway.stop() } }

        // The first answer teaches the budget; then 19 more than the window holds, 4 at a time.
        #expect(try await gateway.request("GET", "/api/item", headers: [("X-API-Key", "team-a")]).status == 200)
        let statuses = try await Self.offer(gateway, count: 19, concurrency: 4)
        #expect(statuses.allSatisfy { $0 == 200 }, "statuses \(statuses)")
        #expect(provider.counts.refused == 0)
        #expect(provider.counts.served == 20)
    }

    @Test("a Unix reset from a provider whose clock is 30 s off is read against its Date: nothing refused")
    func skewedUnixReset() async throws {
        let provider = RateLimitedProvider(limit: 4, window: .seconds(1), form: .xRateLimit(unixReset: true), clockOffset: 30)
        try await provider.start()
        defer { Task { await provider.shutdown() } }
        let gateway = try TestGateway(try Self.config(provider: provider))
        defer { Task { await gateway.stop() } }
        #expect(try await gateway.request("GET", "/api/item", headers: [("X-API-Key", "k")]).status == 200)
        let statuses = try await Self.offer(gateway, count: 11, concurrency: 3, key: "k")
        #expect(statuses.allSatisfy { $0 == 200 }, "statuses \(statuses)")
        #expect(provider.counts.refused == 0)
    }

    @Test("a provider that sends only Retry-After: its 429 reaches one caller, and nothing reaches it during the hold")
    func retryAfterOnly() async throws {
        let provider = RateLimitedProvider(limit: 3, window: .seconds(1), form: .retryAfterOnly)
        try await provider.start()
        defer { Task { await provider.shutdown() } }
        let gateway = try TestGateway(try Self.config(provider: provider))
        defer { Task { await gateway.stop() } }
        let statuses = try await Self.offer(gateway, count: 12, concurrency: 1, key: "k")
        #expect(provider.counts.duringHold == 0, "requests reached the provider during a hold it announced")
        // Each window's fourth request meets the provider's 429 (nothing said the limit before it).
        #expect(statuses.filter { $0 == 429 }.count == provider.counts.refused)
        #expect(statuses.filter { $0 == 200 }.count == provider.counts.served)
    }

    @Test("when_exhausted: reject refuses at once with 429 provider_exhausted and Retry-After; the provider sees nothing more")
    func rejectAtOnce() async throws {
        let provider = RateLimitedProvider(limit: 2, window: .seconds(60), form: .ietf,
                                           clockOffset: RateLimitedProvider.offsetToFreshWindow(.seconds(60)))
        try await provider.start()
        defer { Task { await provider.shutdown() } }
        let gateway = try TestGateway(try Self.config(provider: provider, whenExhausted: "reject"))
        defer { Task { await gateway.stop() } }
        #expect(try await gateway.request("GET", "/api/item", headers: [("X-API-Key", "k")]).status == 200)
        #expect(try await gateway.request("GET", "/api/item", headers: [("X-API-Key", "k")]).status == 200)
        let refused = try await gateway.request("GET", "/api/item", headers: [("X-API-Key", "k")])
        #expect(refused.status == 429)
        #expect(refused.bodyText.contains("\"provider_exhausted\""))
        #expect(Int(refused.header("retry-after") ?? "") ?? 0 >= 1)
        #expect(provider.counts.served == 2)
        #expect(provider.counts.refused == 0)
        // Another key has its own budget.
        #expect(try await gateway.request("GET", "/api/item", headers: [("X-API-Key", "other")]).status == 200)
    }
}

/// `on_limit: wait` through the real gateway: the wait is a timer on the request's event loop.
@Suite("Rate limit waiting, end to end")
struct RateLimitWaitingEndToEndTests {
    static func config(upstream: TestUpstream) throws -> PorticoConfig {
        try ConfigLoader.load(yaml: """
            listen: { address: 127.0.0.1, port: 0, request_timeout: 30s }
            admin: { enabled: false }
            logging: { level: error }
            upstreams:
              up: { url: "\(upstream.baseURL.absoluteString)", transport: nio }
            middleware:
              paced: { type: rate_limit, key: route, rate: 2/s, burst: 1, on_limit: wait, max_wait: 10s }
            routes:
              - { name: paced, match: { path_prefix: / }, upstream: up, middleware: [paced] }
            """, environment: [:])
    }

    /// Whether `condition` holds within 30 s (a loaded machine's bound, not a timing claim).
    static func eventually(_ condition: () -> Bool) async -> Bool {
        let deadline = ContinuousClock.now.advanced(by: .seconds(30))
        while ContinuousClock.now < deadline {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return condition()
    }

    @Test("requests over the rate wait for their tokens and are all served, none refused")
    func overTheRateAllServed() async throws {
        let upstream = TestUpstream()
        upstream.route("/item", .text("ok\n"))
        try await upstream.start()
        defer { Task { await upstream.shutdown() } }
        let gateway = try TestGateway(try Self.config(upstream: upstream))
        defer { Task { await gateway.stop() } }
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<5 { group.addTask { try await gateway.request("GET", "/item").status } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(statuses == [200, 200, 200, 200, 200])
        #expect(upstream.hits("/item") == 5)
    }

    @Test("a client that leaves while waiting never reaches the upstream, and its place in the queue is freed")
    func leaverNeverForwarded() async throws {
        let upstream = TestUpstream()
        upstream.route("/item", .text("ok\n"))
        try await upstream.start()
        defer { Task { await upstream.shutdown() } }
        // One a minute: the leaver's slot is a minute away, so nothing but its leaving can end its wait.
        var config = try Self.config(upstream: upstream)
        config.middleware["paced"] = .rateLimit({
            var limit = RateLimitConfig(rate: Rate(count: 1, per: .seconds(60)), burst: 1)
            limit.key = [.route]
            limit.onLimit = .wait
            limit.maxWait = .seconds(120)
            return limit
        }())
        config.listen.requestTimeout = .seconds(300)
        let gateway = try TestGateway(config)
        defer { Task { await gateway.stop() } }
        let queue = try #require((gateway.server.gateway.current.middleware["paced"] as? RateLimitMiddleware)?.queue)
        #expect(try await gateway.request("GET", "/item").status == 200)          // the burst
        let leaver = try gateway.connect()
        try await leaver.send("GET /item HTTP/1.1\r\nHost: t\r\n\r\n")
        #expect(await Self.eventually { queue.count == 1 })
        leaver.reset()
        #expect(await Self.eventually { queue.count == 0 })
        #expect(upstream.hits("/item") == 1, "the leaver reached the upstream")
    }
}
