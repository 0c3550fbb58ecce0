import Foundation
import HTTPTypes
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// The middleware over counts in this process (`LocalQuotaCounts`): allocations, headers, the
/// refusal, the reset at the window's start on the injected clock. The store itself is tested
/// against a real redis-server (`QuotaTests`), and here against one that is away.
@Suite("Quota middleware")
struct QuotaMiddlewareTests {
    /// 2025-06-15T15:06:40Z: 8 h 53 min 20 s (32000 s) before the day ends in UTC.
    let clock = ManualClock(wallNow: Date(timeIntervalSince1970: 1_750_000_000))
    let ok: NextHandler = { _, _ in GatewayResponse(status: .ok, body: "fine") }

    static func config(limit: Int = 10, per: QuotaConfig.Period = .day,
                       _ configure: (inout QuotaConfig) -> Void = { _ in }) -> QuotaConfig {
        var config = QuotaConfig(limit: limit, per: per, store: "fleet")
        configure(&config)
        return config
    }

    static func teams(_ config: inout QuotaConfig) {
        config.key = [.header("x-team")]
        config.allocations = [.init(key: "team-a", share: 0.6), .init(key: "team-b", share: 0.3)]
    }

    func send(_ middleware: QuotaMiddleware, team: String? = nil, next: NextHandler? = nil) async throws -> GatewayResponse {
        let request = RetryFixture.request(headers: team.map { [("X-Team", $0)] } ?? [])
        return try await middleware.handle(request, context: RetryFixture.context(clock: clock), next: next ?? ok)
    }

    func refusal(_ middleware: QuotaMiddleware, team: String? = nil) async -> GatewayError? {
        await #expect(throws: GatewayError.self) { _ = try await send(middleware, team: team) }
    }

    /// How many requests of `team` pass before the first refusal (at most `cap`).
    func served(_ middleware: QuotaMiddleware, team: String?, cap: Int = 50) async -> Int {
        for count in 0..<cap where (try? await send(middleware, team: team)) == nil { return count }
        return cap
    }

    @Test("responses carry RateLimit-Policy (the allocation over the window's length) and RateLimit (left, seconds to the reset)")
    func headers() async throws {
        let middleware = QuotaMiddleware(name: "month", Self.config())
        let response = try await send(middleware)
        #expect(response.status == .ok)
        #expect(response.headerFields[RateLimitHeaders.policyName] == "\"month\";q=10;w=86400")
        #expect(response.headerFields[RateLimitHeaders.stateName] == "\"month\";r=9;t=32000")
        // An error from further in carries them too.
        let failing: NextHandler = { _, _ in throw UpstreamError.timeout.gatewayError(upstream: "orders") }
        let error = await #expect(throws: GatewayError.self) { _ = try await send(middleware, next: failing) }
        #expect(error?.headerFields[RateLimitHeaders.stateName] == "\"month\";r=8;t=32000")
    }

    @Test("over quota: 429 quota_exhausted with Retry-After at the window's end; nothing further in is called")
    func exhausted() async throws {
        let middleware = QuotaMiddleware(name: "q", Self.config(limit: 2))
        _ = try await send(middleware)
        _ = try await send(middleware)
        let called = Counter()
        let error = await #expect(throws: GatewayError.self) {
            _ = try await send(middleware, next: { _, _ in called.increment(); return GatewayResponse(status: .ok) })
        }
        #expect(called.value == 0)
        #expect(error?.status == .tooManyRequests && error?.code == "quota_exhausted" && error?.kind == .quotaExhausted)
        #expect(error?.headerFields[.retryAfter] == "32000")
        #expect(error?.headerFields[RateLimitHeaders.stateName] == "\"q\";r=0;t=32000")
        #expect(error?.message.contains("resets at 2025-06-16T00:00:00Z") == true, "\(error?.message ?? "")")
    }

    @Test("the count resets at the window's start: the injected clock moved across the boundary, no sleep")
    func resetsAtWindowStart() async throws {
        let middleware = QuotaMiddleware(name: "q", Self.config(limit: 3, per: .hour))
        #expect(await served(middleware, team: nil) == 3)
        // 15:06:40 → 15:59:59.9: the same hour, still spent.
        clock.advance(by: .seconds(53 * 60 + 19) + .milliseconds(900))
        #expect(await refusal(middleware)?.headerFields[.retryAfter] == "1")
        clock.advance(by: .milliseconds(100))
        let response = try await send(middleware)
        #expect(response.headerFields[RateLimitHeaders.stateName] == "\"q\";r=2;t=3600")
        #expect(await served(middleware, team: nil) == 2)
    }

    @Test("allocations hold: team-a its 60 %, team-b its 30 %, unlisted keys and keyless requests share the rest as one pool")
    func allocationsHold() async throws {
        let middleware = QuotaMiddleware(name: "q", Self.config(limit: 20, Self.teams))
        #expect(await served(middleware, team: "team-a") == 12)
        #expect(await served(middleware, team: "team-b") == 6)
        // The pool: 2 requests for everyone else together.
        _ = try await send(middleware, team: "team-c")
        _ = try await send(middleware)
        #expect(await refusal(middleware, team: "team-d")?.message.contains("allocation default") == true)
        let policy = try await send(QuotaMiddleware(name: "q", Self.config(limit: 20, Self.teams)), team: "team-b")
        #expect(policy.headerFields[RateLimitHeaders.policyName] == "\"q\";q=6;w=86400")
    }

    @Test("default: 0% refuses unlisted keys at once, without Retry-After (waiting would not help); listed keys still pass")
    func defaultZero() async throws {
        let middleware = QuotaMiddleware(name: "q", Self.config(limit: 10) {
            Self.teams(&$0)
            $0.defaultShare = 0
        })
        let error = await refusal(middleware, team: "stranger")
        #expect(error?.code == "quota_exhausted" && error?.headerFields[.retryAfter] == nil)
        #expect(error?.headerFields[RateLimitHeaders.stateName] == "\"q\";r=0;t=32000")
        #expect(await refusal(middleware, team: nil) != nil)
        #expect(try await send(middleware, team: "team-a").status == .ok)
    }

    @Test("a list key matches allocations by its values joined with +")
    func listKey() async throws {
        let middleware = QuotaMiddleware(name: "q", Self.config(limit: 10) {
            $0.key = [.route, .header("x-team")]
            $0.allocations = [.init(key: "orders+team-a", share: 0.5)]
            $0.defaultShare = 0
        })
        #expect(await served(middleware, team: "team-a") == 5)
        #expect(await refusal(middleware, team: "team-b")?.headerFields[.retryAfter] == nil)
    }

    @Test("headers: false sends none but keeps Retry-After; a limit further in keeps its own item beside this one")
    func headerOptions() async throws {
        let quiet = QuotaMiddleware(name: "q", Self.config(limit: 1) { $0.headers = false })
        let response = try await send(quiet)
        #expect(response.headerFields[RateLimitHeaders.policyName] == nil && response.headerFields[RateLimitHeaders.stateName] == nil)
        #expect(await refusal(quiet)?.headerFields[.retryAfter] == "32000")

        let inner: NextHandler = { _, _ in
            var response = GatewayResponse(status: .ok)
            response.headerFields[RateLimitHeaders.stateName] = "\"limit\";r=4;t=1"
            return response
        }
        let both = try await send(QuotaMiddleware(name: "q", Self.config()), next: inner)
        #expect(both.headerFields[RateLimitHeaders.stateName] == "\"limit\";r=4;t=1, \"q\";r=9;t=32000")
    }

    @Test("the store away: local counts on in this process, allow lets all through, deny refuses with Retry-After: 1; errors are counted")
    func storeAway() async throws {
        let refusing = try RefusingPort()
        var storeConfig = StoreConfig(host: "127.0.0.1", port: refusing.port)
        storeConfig.timeout = .seconds(2)
        let backend = try RedisBucketStore(name: "fleet", config: storeConfig, logger: RetryFixture.logger)
        defer { Task { await backend.shutdown() } }
        func middleware(_ policy: QuotaConfig.StoreErrorPolicy) -> QuotaMiddleware {
            let config = Self.config(limit: 3) { $0.onStoreError = policy }
            let store = RedisQuotaStore(backend: backend, namespace: "q-\(policy.rawValue)", onStoreError: policy,
                                        local: LocalQuotaCounts(allocations: 1), logger: RetryFixture.logger)
            return QuotaMiddleware(name: "q", config, store: store)
        }
        let local = middleware(.local)
        #expect(await served(local, team: nil) == 3)
        #expect(await refusal(local)?.headerFields[.retryAfter] == "32000")
        #expect(await served(middleware(.allow), team: nil, cap: 10) == 10)
        let denied = await refusal(middleware(.deny))
        #expect(denied?.code == "quota_exhausted" && denied?.headerFields[.retryAfter] == "1")
        #expect(denied?.message.contains("store is unavailable") == true)
        // What local served is owed to the shared count once the store answers.
        let store = try #require(local.store as? RedisQuotaStore)
        let window = local.windows.window(containing: clock.wallNow)
        #expect(store.local.takePending(local.allocations.pool, in: window) == 3)
    }

    @Test("explain: settings, what it answers by itself, and which allocation a request draws from")
    func describes() throws {
        let middleware = QuotaMiddleware(name: "q", Self.config(limit: 20, Self.teams))
        let description = middleware.describe(for: nil)
        #expect(description.settings == "20 a day (GMT), key header:x-team, allocations team-a 12, team-b 6, default 2, store fleet, on store error: local")
        #expect(description.answersAtOnce == "429 quota_exhausted when the request's allocation is spent for this day")
        let request = ExplainedRequest(request: RetryFixture.request(headers: [("X-Team", "team-a")]),
                                       context: RetryFixture.context(clock: clock))
        #expect(middleware.describe(for: request).action
            == "counts one request against allocation team-a: 12 in the day that resets at 2025-06-16T00:00:00Z")
    }
}

/// A count shared with a `@Sendable` closure.
private final class Counter: Sendable {
    private let count = Atomic<Int>(0)
    var value: Int { count.load(ordering: .relaxed) }
    func increment() { count.add(1, ordering: .relaxed) }
}
