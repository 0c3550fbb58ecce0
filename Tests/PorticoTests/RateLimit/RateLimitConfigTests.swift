import Portico
import Testing

@Suite("Rate limit configuration")
struct RateLimitConfigTests {
    func rateLimit(_ body: String) throws -> RateLimitConfig? {
        let config = try load("middleware:\n  l:\n    type: rate_limit\n" + body + minimalRoute)
        guard let limit = config.middleware["l"]?.settings(as: RateLimitConfig.self) else { return nil }
        return limit
    }

    @Test("defaults: client_ip key, burst = one second of rate rounded up")
    func defaults() throws {
        let c = try #require(try rateLimit("    rate: 6000/m\n"))
        #expect(c.key == [.clientIP])
        #expect(c.rate.perSecond == 100)
        #expect(c.burst == 100)
        #expect(c.missingKey == .shared && c.headers && c.maxKeys == 100_000)
        #expect(try rateLimit("    rate: 1/m\n")?.burst == 1)
        #expect(try rateLimit("    rate: 2.5/s\n")?.burst == 3)
    }

    @Test("every key")
    func everyKey() throws {
        let c = try #require(try rateLimit("""
                key: [route, "header:X-API-Key"]
                rate: 100/s
                burst: 250
                missing_key: reject
                headers: false
                max_keys: 5000

            """))
        #expect(c.key == [.route, .header("x-api-key")])
        #expect(c.burst == 250 && c.missingKey == .reject && !c.headers && c.maxKeys == 5000)
        #expect(try rateLimit("    rate: 1/s\n    key: header:Authorization\n")?.key == [.header("authorization")])
    }

    @Test("rate is required")
    func rateRequired() {
        #expect(diagnostics("middleware:\n  l:\n    type: rate_limit\n    burst: 3\n" + minimalRoute)
            == ["portico.yaml:2 middleware.l: missing required key \"rate\""])
    }

    @Test("invalid values", arguments: [
        ("key: client-ip", "middleware.l.key: unknown rate limit key \"client-ip\" (did you mean \"client_ip\"?); expected client_ip, route or header:NAME"),
        ("key: \"header:bad name\"", "middleware.l.key: invalid header name in \"header:bad name\""),
        ("key: [route, route]", "middleware.l.key[1]: duplicate key part \"route\""),
        ("missing_key: drop", "middleware.l.missing_key: expected one of shared, reject, got \"drop\""),
        ("burst: 0", "middleware.l.burst: must be between 1 and 1000000000, got 0"),
        ("max_keys: 0", "middleware.l.max_keys: must be between 1 and 100000000, got 0"),
        ("rate: fast", "middleware.l.rate: invalid rate \"fast\" (expected e.g. 100/s, 6000/m, 10/h)"),
    ])
    func invalid(line: String, expected: String) {
        let yaml = "middleware:\n  l:\n    type: rate_limit\n    \(line)\n" + (line.hasPrefix("rate:") ? "" : "    rate: 10/s\n") + minimalRoute
        #expect(diagnostics(yaml) == ["portico.yaml:4 \(expected)"])
    }

    @Test("unknown middleware types suggest the new ones")
    func typeSuggestion() {
        let found = diagnostics("middleware:\n  l:\n    type: rate_limt\n" + minimalRoute)
        #expect(found == ["portico.yaml:3 middleware.l.type: unknown middleware type \"rate_limt\" (did you mean \"rate_limit\"?); supported: access_log, auth, cache, compress, headers, quota, rate_limit, retry"])
    }
}
