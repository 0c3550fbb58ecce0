import Portico
import Testing

@Suite("Retry configuration")
struct RetryConfigTests {
    func retry(_ body: String) throws -> RetryConfig {
        let config = try load("middleware:\n  r:\n    type: retry\n" + body + minimalRoute)
        guard let retry = config.middleware["r"]?.settings(as: RetryConfig.self) else {
            Issue.record("not a retry middleware")
            return RetryConfig()
        }
        return retry
    }

    @Test("defaults")
    func defaults() throws {
        let c = try retry("")
        #expect(c == RetryConfig())
        #expect(c.attempts == 3)
        #expect(c.on == [.connectError, .timeout, .reset, .status(502), .status(503), .status(504)])
        #expect(c.methods == ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"])
        #expect(c.backoffBase == .milliseconds(25) && c.backoffCap == .seconds(1))
        #expect(c.perTryTimeout == nil && c.budget == 0.2 && c.minRetriesPerSecond == 3 && c.maxRetryAfter == .seconds(5))
    }

    @Test("every key")
    func everyKey() throws {
        let c = try retry("""
                attempts: 5
                on: [connect_error, 503, 429]
                methods: [get, POST]
                backoff: { base: 10ms, cap: 2s }
                per_try_timeout: 1500ms
                budget: 12.5%
                min_retries_per_second: 0
                max_retry_after: 30s

            """)
        #expect(c.attempts == 5)
        #expect(c.on == [.connectError, .status(503), .status(429)])
        #expect(c.methods == ["GET", "POST"])
        #expect(c.backoffBase == .milliseconds(10) && c.backoffCap == .seconds(2))
        #expect(c.perTryTimeout == .milliseconds(1500))
        #expect(c.budget == 0.125 && c.minRetriesPerSecond == 0 && c.maxRetryAfter == .seconds(30))
    }

    @Test("4xx other than 429 and non-error statuses are refused")
    func refusesClientErrors() {
        let found = diagnostics("middleware:\n  r:\n    type: retry\n    on: [404, 200, 503]\n" + minimalRoute)
        #expect(found.count == 2)
        #expect(found.first == "portico.yaml:4 middleware.r.on[0]: status 404 cannot be retried (only 5xx and 429: other statuses would repeat the same answer)")
    }

    @Test("misspelt conditions and keys get suggestions")
    func suggestions() {
        let found = diagnostics("middleware:\n  r:\n    type: retry\n    on: [conect_error]\n    atempts: 2\n" + minimalRoute)
        #expect(found.contains { $0.hasPrefix("portico.yaml:4 middleware.r.on[0]: unknown retry condition \"conect_error\" (did you mean \"connect_error\"?)") })
        #expect(found.contains("portico.yaml:5 middleware.r.atempts: unknown key \"atempts\" (did you mean \"attempts\"?)"))
    }

    @Test("range and shape checks", arguments: [
        ("attempts: 0", "middleware.r.attempts: must be between 1 and 10, got 0"),
        ("budget: 120%", "middleware.r.budget: must be between 0% and 100%, got \"120%\""),
        ("budget: 0.2", "middleware.r.budget: expected a percentage such as 20%, got \"0.2\""),
        ("backoff: { base: 2s, cap: 1s }", "middleware.r.backoff.cap: must not be less than backoff.base"),
        ("per_try_timeout: 0", "middleware.r.per_try_timeout: must be greater than 0"),
        ("on: [503, 503]", "middleware.r.on[1]: duplicate retry condition \"503\""),
    ])
    func invalid(line: String, expected: String) {
        let found = diagnostics("middleware:\n  r:\n    type: retry\n    \(line)\n" + minimalRoute)
        #expect(found == ["portico.yaml:4 \(expected)"])
    }
}
