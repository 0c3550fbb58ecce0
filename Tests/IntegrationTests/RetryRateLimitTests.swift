import Foundation
import Logging
import Portico
import PorticoTesting
import Synchronization
import Testing

/// Collects access-log lines (their metadata), so tests can read attempts and retry notes.
final class AccessLogCapture: Sendable {
    private let capture = LogCapture(message: "request", minimumLevel: .info)

    var logger: Logger { capture.logger }
    var records: [Logger.Metadata] { capture.records }

    /// `retries` summed over access-log lines.
    var totalRetries: Int {
        records.compactMap { $0["retries"].flatMap { Int($0.description) } }.reduce(0, +)
    }
}

/// A config proxying `/api/` to `port` through `[log, retry]` (and optionally `limit`).
func protectConfig(upstreamPort: Int, retry: RetryConfig, rateLimit: RateLimitConfig? = nil,
                   routeTimeout: Duration = .seconds(20)) -> PorticoConfig {
    var config = PorticoConfig()
    config.upstreams["app"] = UpstreamConfig(name: "app", url: URL(string: "http://127.0.0.1:\(upstreamPort)")!)
    config.upstreams["app"]?.transport = .nio
    config.middleware["log"] = .accessLog(AccessLogConfig())
    config.middleware["retry"] = .retry(retry)
    var chain = ["log", "retry"]
    if let rateLimit {
        config.middleware["limit"] = .rateLimit(rateLimit)
        chain = ["log", "limit", "retry"]
    }
    config.routes = [
        RouteConfig(name: "api", match: .init(pathPrefix: "/api/"), upstream: "app", middleware: chain, timeout: routeTimeout),
    ]
    return config
}

/// Quick backoff so the tests spend their time on the network, not waiting.
func quickRetry(_ configure: (inout RetryConfig) -> Void = { _ in }) -> RetryConfig {
    var retry = RetryConfig()
    retry.backoffBase = .milliseconds(1)
    retry.backoffCap = .milliseconds(5)
    retry.minRetriesPerSecond = 1000
    configure(&retry)
    return retry
}

/// Runs `body` with a started upstream and gateway, stopping both afterwards.
func withGateway<T>(_ upstream: TestUpstream, _ config: (Int) -> PorticoConfig, logger: Logger? = nil,
                    clock: any GatewayClock = SystemClock(), _ body: (TestGateway) async throws -> T) async throws -> T {
    try await upstream.start()
    let gateway: TestGateway
    do {
        gateway = try TestGateway(config(upstream.port), logger: logger ?? Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
                                  clock: clock)
    } catch {
        await upstream.shutdown()
        throw error
    }
    do {
        let result = try await body(gateway)
        await gateway.stop()
        await upstream.shutdown()
        return result
    } catch {
        await gateway.stop()
        await upstream.shutdown()
        throw error
    }
}

/// Counts calls to a scripted path.
final class CallCounter: Sendable {
    private let value = Mutex(0)
    func next() -> Int { value.withLock { $0 += 1; return $0 } }
}

@Suite("Retry and rate limiting through the real gateway")
struct RetryRateLimitTests {
    @Test("an upstream failing twice then succeeding: three attempts, one success")
    func failsTwiceThenSucceeds() async throws {
        let upstream = TestUpstream()
        let calls = CallCounter()
        upstream.route("/api/flaky") { _ in calls.next() <= 2 ? .text("busy", status: 503) : .text("done") }
        let log = AccessLogCapture()
        try await withGateway(upstream, { protectConfig(upstreamPort: $0, retry: quickRetry()) }, logger: log.logger) { gateway in
            let response = try await gateway.request("GET", "/api/flaky")
            #expect(response.status == 200)
            #expect(response.bodyText == "done")
            #expect(upstream.hits("/api/flaky") == 3)
            let line = try #require(log.records.last)
            #expect(line["attempts"]?.description == "3")
            #expect(line["retries"]?.description == "2")
        }
    }

    @Test("POST is not retried")
    func postNotRetried() async throws {
        let upstream = TestUpstream()
        upstream.route("/api/orders", .text("busy", status: 503))
        try await withGateway(upstream, { protectConfig(upstreamPort: $0, retry: quickRetry()) }) { gateway in
            let response = try await gateway.request("POST", "/api/orders", body: Array("{}".utf8))
            #expect(response.status == 503)
            #expect(upstream.hits("/api/orders") == 1)
        }
    }

    @Test("Retry-After is honoured; one beyond max_retry_after is passed back at once")
    func retryAfter() async throws {
        let upstream = TestUpstream()
        let calls = CallCounter()
        upstream.route("/api/later") { _ in
            calls.next() == 1 ? Response(status: 503, headers: [("Retry-After", "1")], body: "wait") : .text("now")
        }
        upstream.route("/api/much-later", Response(status: 503, headers: [("Retry-After", "3600")], body: "wait"))
        try await withGateway(upstream, { protectConfig(upstreamPort: $0, retry: quickRetry()) }) { gateway in
            let start = ContinuousClock.now
            let response = try await gateway.request("GET", "/api/later")
            #expect(response.status == 200)
            #expect(upstream.hits("/api/later") == 2)
            #expect(ContinuousClock.now - start >= .milliseconds(990))   // waited the second it was asked to

            let refused = try await gateway.request("GET", "/api/much-later")
            #expect(refused.status == 503)
            #expect(refused.header("retry-after") == "3600")
            #expect(upstream.hits("/api/much-later") == 1)
        }
    }

    @Test("a dead upstream: the budget stops retries from multiplying the load")
    func budgetUnderDeadUpstream() async throws {
        let gone = try RefusingPort()
        let deadPort = gone.port
        defer { withExtendedLifetime(gone) {} }

        let upstream = TestUpstream()   // unused; keeps withGateway's shape
        let log = AccessLogCapture()
        let retry = quickRetry { $0.budget = 0.2; $0.minRetriesPerSecond = 0 }
        let requests = 30
        try await withGateway(upstream, { _ in protectConfig(upstreamPort: deadPort, retry: retry) }, logger: log.logger) { gateway in
            for _ in 0..<requests {
                let response = try await gateway.request("GET", "/api/anything")
                #expect(response.status == 502)
            }
        }
        let retries = log.totalRetries
        #expect(log.records.count == requests)
        #expect(retries >= 1)
        #expect(retries <= requests / 5 + 1)   // without a budget: 60
        #expect(log.records.contains { $0["retry_stopped"]?.description == "budget" })
    }

    @Test("a per-try timeout cuts a hung attempt and the retry succeeds")
    func perTryTimeout() async throws {
        let upstream = TestUpstream()
        let calls = CallCounter()
        upstream.route("/api/hang") { _ in calls.next() == 1 ? .never : .text("second try") }
        // The hung try costs the whole per-try timeout. Without the cut the request would hang to
        // the route's deadline (a 504); with it, a later try answers. On a loaded machine the
        // second try may itself outlast the per-try timeout (it is cut too, as it should be, and
        // the third answers): at most the configured attempts.
        let retry = quickRetry { $0.perTryTimeout = .seconds(5) }
        try await withGateway(upstream, { protectConfig(upstreamPort: $0, retry: retry, routeTimeout: .seconds(60)) }) { gateway in
            let response = try await gateway.request("GET", "/api/hang")
            #expect(response.status == 200)
            #expect(response.bodyText == "second try")
            #expect((2...retry.attempts).contains(upstream.hits("/api/hang")), "\(upstream.hits("/api/hang")) tries")
        }
    }

    @Test("over the rate limit: 429 with Retry-After and the IETF headers")
    func rateLimited() async throws {
        let upstream = TestUpstream()
        var limit = RateLimitConfig(rate: Rate(count: 1, per: .seconds(60)), burst: 2)
        limit.key = [.clientIP]
        try await withGateway(upstream, { protectConfig(upstreamPort: $0, retry: quickRetry(), rateLimit: limit) }) { gateway in
            let first = try await gateway.request("GET", "/api/a")
            #expect(first.status == 200)
            #expect(first.header("ratelimit-policy") == "\"limit\";q=2;w=120")
            #expect(first.header("ratelimit") == "\"limit\";r=1;t=60")
            let second = try await gateway.request("GET", "/api/a")
            #expect(second.status == 200)
            #expect(second.header("ratelimit")?.hasPrefix("\"limit\";r=0;t=") == true)
            let third = try await gateway.request("GET", "/api/a")
            #expect(third.status == 429)
            #expect(third.header("content-type") == "application/json")
            #expect(third.bodyText.contains("\"error\":\"rate_limited\""))
            let retryAfter = try #require(third.header("retry-after").flatMap(Int.init))
            #expect(retryAfter >= 1 && retryAfter <= 60)
            #expect(third.header("ratelimit-policy") == "\"limit\";q=2;w=120")
            #expect(third.header("ratelimit")?.hasPrefix("\"limit\";r=0;t=") == true)
            #expect(upstream.hits("/api/a") == 2)
        }
    }
}

private typealias Response = TestUpstream.Response
