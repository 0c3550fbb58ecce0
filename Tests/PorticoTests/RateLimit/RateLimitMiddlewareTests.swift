import Foundation
import HTTPTypes
import Portico
import PorticoTesting
import Testing

@Suite("Rate limit middleware")
struct RateLimitMiddlewareTests {
    let clock = ManualClock()

    func config(_ rate: Rate = Rate(count: 2, per: .seconds(1)), burst: Int? = 2,
                _ configure: (inout RateLimitConfig) -> Void = { _ in }) -> RateLimitConfig {
        var config = RateLimitConfig(rate: rate, burst: burst)
        configure(&config)
        return config
    }

    let ok: NextHandler = { _, _ in GatewayResponse(status: .ok, body: "fine") }

    @Test("IETF headers: structured-field policy and state")
    func headerFormatting() {
        let policy = TokenBucketPolicy(ratePerSecond: 100, burst: 200)
        #expect(RateLimitHeaders.policy(name: "limit", policy: policy) == "\"limit\";q=200;w=2")
        #expect(RateLimitHeaders.policy(name: "slow", policy: TokenBucketPolicy(ratePerSecond: 1.0 / 60, burst: 1)) == "\"slow\";q=1;w=60")
        let decision = RateLimitDecision(allowed: true, remaining: 42, resetAfter: .milliseconds(1200), retryAfter: .zero)
        #expect(RateLimitHeaders.state(name: "limit", decision: decision) == "\"limit\";r=42;t=2")
        let full = RateLimitDecision(allowed: true, remaining: 9, resetAfter: .zero, retryAfter: .zero)
        #expect(RateLimitHeaders.state(name: "limit", decision: full) == "\"limit\";r=9;t=0")
        #expect(RateLimitHeaders.sfString("a\"b\\c") == "\"a\\\"b\\\\c\"")
        #expect(RateLimitHeaders.sfString("café\n") == "\"caf??\"")
    }

    @Test("allowed responses carry RateLimit-Policy and RateLimit")
    func headersOnSuccess() async throws {
        let middleware = RateLimitMiddleware(name: "limit", config())
        let context = RetryFixture.context(clock: clock)
        let response = try await middleware.handle(RetryFixture.request(), context: context, next: ok)
        #expect(response.status == .ok)
        #expect(response.headerFields[RateLimitHeaders.policyName] == "\"limit\";q=2;w=1")
        #expect(response.headerFields[RateLimitHeaders.stateName] == "\"limit\";r=1;t=1")
    }

    @Test("over the limit: 429 rate_limited with Retry-After and the headers")
    func rejects() async throws {
        let middleware = RateLimitMiddleware(name: "limit", config())
        let context = RetryFixture.context(clock: clock)
        _ = try await middleware.handle(RetryFixture.request(), context: context, next: ok)
        _ = try await middleware.handle(RetryFixture.request(), context: context, next: ok)
        let error = await #expect(throws: GatewayError.self) {
            _ = try await middleware.handle(RetryFixture.request(), context: context, next: ok)
        }
        #expect(error?.status == .tooManyRequests)
        #expect(error?.code == "rate_limited")
        #expect(error?.headerFields[.retryAfter] == "1")
        #expect(error?.headerFields[RateLimitHeaders.stateName] == "\"limit\";r=0;t=1")
        // Time refills the bucket.
        clock.advance(by: .milliseconds(500))
        _ = try await middleware.handle(RetryFixture.request(), context: context, next: ok)
    }

    @Test("errors from further in carry the headers too")
    func headersOnErrors() async throws {
        let middleware = RateLimitMiddleware(name: "limit", config())
        let failing: NextHandler = { _, _ in throw UpstreamError.timeout.gatewayError(upstream: "orders") }
        let error = await #expect(throws: GatewayError.self) {
            _ = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: failing)
        }
        #expect(error?.code == "upstream_timeout")
        #expect(error?.headerFields[RateLimitHeaders.policyName] != nil)
    }

    @Test("headers: false leaves responses alone but still sends Retry-After")
    func headersOff() async throws {
        let middleware = RateLimitMiddleware(name: "limit", config(burst: 1) { $0.headers = false })
        let context = RetryFixture.context(clock: clock)
        let response = try await middleware.handle(RetryFixture.request(), context: context, next: ok)
        #expect(response.headerFields[RateLimitHeaders.policyName] == nil)
        #expect(response.headerFields[RateLimitHeaders.stateName] == nil)
        let error = await #expect(throws: GatewayError.self) {
            _ = try await middleware.handle(RetryFixture.request(), context: context, next: ok)
        }
        #expect(error?.headerFields[.retryAfter] == "1")
        #expect(error?.headerFields[RateLimitHeaders.stateName] == nil)
    }

    @Test("key extraction: client address, header, route, combinations")
    func keys() {
        let request = RetryFixture.request(clientAddress: "198.51.100.4", headers: [("X-API-Key", "k1")])
        #expect(RateLimitMiddleware.key(for: request, parts: [.clientIP], route: "r") == "198.51.100.4")
        #expect(RateLimitMiddleware.key(for: request, parts: [.header("x-api-key")], route: "r") == "k1")
        #expect(RateLimitMiddleware.key(for: request, parts: [.route], route: "r") == "r")
        #expect(RateLimitMiddleware.key(for: request, parts: [.route, .header("x-api-key")], route: "r") == "r\u{0}k1")
        #expect(RateLimitMiddleware.key(for: request, parts: [.header("x-other")], route: "r") == nil)
        #expect(RateLimitMiddleware.key(for: RetryFixture.request(clientAddress: ""), parts: [.clientIP], route: "r") == nil)
        #expect(RateLimitMiddleware.key(for: request, parts: [.clientIP, .header("x-other")], route: "r") == nil)
        let long = RetryFixture.request(headers: [("X-API-Key", String(repeating: "a", count: 10_000))])
        let key = RateLimitMiddleware.key(for: long, parts: [.header("x-api-key")], route: nil)
        #expect((key?.utf8.count ?? .max) <= 128)
        let other = RetryFixture.request(headers: [("X-API-Key", String(repeating: "a", count: 9_999) + "b")])
        #expect(RateLimitMiddleware.key(for: other, parts: [.header("x-api-key")], route: nil) != key)
    }

    @Test("keyless requests share a bucket, or get 400 with missing_key: reject")
    func missingKey() async throws {
        let shared = RateLimitMiddleware(name: "limit", config(burst: 1) { $0.key = [.header("x-api-key")] })
        let context = RetryFixture.context(clock: clock)
        _ = try await shared.handle(RetryFixture.request(), context: context, next: ok)
        let limited = await #expect(throws: GatewayError.self) {
            _ = try await shared.handle(RetryFixture.request(clientAddress: "192.0.2.99"), context: context, next: ok)
        }
        #expect(limited?.code == "rate_limited")
        // A keyed request has its own bucket.
        _ = try await shared.handle(RetryFixture.request(headers: [("X-API-Key", "k")]), context: context, next: ok)

        let reject = RateLimitMiddleware(name: "limit", config { $0.key = [.header("x-api-key")]; $0.missingKey = .reject })
        let refused = await #expect(throws: GatewayError.self) {
            _ = try await reject.handle(RetryFixture.request(), context: context, next: ok)
        }
        #expect(refused?.status == .badRequest)
        #expect(refused?.code == "rate_limit_key_missing")
    }

    @Test("a custom store can be plugged in")
    func customStore() async throws {
        struct Deny: RateLimitStore {
            func acquire(_ key: String, at now: ContinuousClock.Instant, maxWait: Duration) async throws -> RateLimitDecision {
                RateLimitDecision(allowed: false, remaining: 0, resetAfter: .seconds(7), retryAfter: .milliseconds(2500))
            }
        }
        let middleware = RateLimitMiddleware(name: "limit", config(), store: Deny())
        let error = await #expect(throws: GatewayError.self) {
            _ = try await middleware.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock), next: ok)
        }
        #expect(error?.headerFields[.retryAfter] == "3")
        #expect(error?.headerFields[RateLimitHeaders.stateName] == "\"limit\";r=0;t=7")
    }

    @Test("a rate_limit outside a quota leaves both items: its own is appended, on a response and on the quota's 429")
    func appendsBesideQuota() async throws {
        let limiter = RateLimitMiddleware(name: "pace", config(burst: 5))
        let wallNow = Date(timeIntervalSince1970: 1_750_000_000)   // 32000 s before the UTC day ends
        let quotaClock = ManualClock(wallNow: wallNow)
        let quota = QuotaMiddleware(name: "daily", QuotaConfig(limit: 1, per: .day, store: "fleet"))
        let inner: NextHandler = { request, context in try await quota.handle(request, context: context, next: ok) }
        let context = RetryFixture.context(clock: quotaClock)
        let response = try await limiter.handle(RetryFixture.request(), context: context, next: inner)
        #expect(response.headerFields[RateLimitHeaders.policyName] == "\"daily\";q=1;w=86400, \"pace\";q=5;w=3")
        #expect(response.headerFields[RateLimitHeaders.stateName] == "\"daily\";r=0;t=32000, \"pace\";r=4;t=1")
        let error = await #expect(throws: GatewayError.self) {
            _ = try await limiter.handle(RetryFixture.request(), context: context, next: inner)
        }
        #expect(error?.code == "quota_exhausted")
        #expect(error?.headerFields[RateLimitHeaders.policyName] == "\"daily\";q=1;w=86400, \"pace\";q=5;w=3")
        #expect(error?.headerFields[RateLimitHeaders.stateName] == "\"daily\";r=0;t=32000, \"pace\";r=3;t=1")
    }
}
