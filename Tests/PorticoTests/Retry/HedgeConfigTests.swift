import Portico
import Testing

@Suite("Retry configuration: hedge")
struct HedgeConfigTests {
    func retry(_ body: String) throws -> RetryConfig {
        let config = try load("middleware:\n  r:\n    type: retry\n" + body + minimalRoute)
        return try #require(config.middleware["r"]?.settings(as: RetryConfig.self))
    }

    @Test("no hedge by default; every key; a fixed delay")
    func keys() throws {
        #expect(try retry("").hedge == nil)
        let c = try retry("    hedge: { after: p99.5, min: 5ms, max_extra: 2 }\n")
        #expect(c.hedge == HedgeConfig(after: .percentile(99.5), min: .milliseconds(5), maxExtra: 2))
        let fixed = try retry("    hedge: { after: 50ms }\n")
        #expect(fixed.hedge == HedgeConfig(after: .fixed(.milliseconds(50)), min: .milliseconds(20), maxExtra: 1))
        #expect(try retry("    hedge: {}\n").hedge == HedgeConfig())
        #expect(HedgeConfig().after.description == "p90" && HedgeConfig.Delay.percentile(99.9).description == "p99.9")
    }

    @Test("a hedge on a retry whose methods include a non-idempotent one is refused")
    func nonIdempotent() {
        let found = diagnostics("middleware:\n  r:\n    type: retry\n    methods: [GET, POST, PATCH]\n    hedge: { after: p90 }\n" + minimalRoute)
        #expect(found == ["portico.yaml:5 middleware.r.hedge: hedging needs idempotent methods, but methods lists \"POST\", \"PATCH\": "
            + "a hedge is sent while the first attempt may still be acting upstream (remove them from methods, or drop hedge)"])
        #expect(diagnostics("middleware:\n  r:\n    type: retry\n    methods: [GET, PUT]\n    hedge: { after: p90 }\n" + minimalRoute).isEmpty)
    }

    @Test("percentiles outside 50-99.9, bad durations and unknown keys are refused", arguments: [
        ("after: p49", "middleware.r.hedge.after: percentile must be between p50 and p99.9, got \"p49\""),
        ("after: p99.95", "middleware.r.hedge.after: percentile must be between p50 and p99.9, got \"p99.95\""),
        ("after: p", "middleware.r.hedge.after: expected a percentile such as p90 or a duration such as 50ms, got \"p\""),
        ("after: 0", "middleware.r.hedge.after: must be greater than 0"),
        ("max_extra: 0", "middleware.r.hedge.max_extra: must be between 1 and 3, got 0"),
    ])
    func invalid(entry: String, expected: String) {
        let found = diagnostics("middleware:\n  r:\n    type: retry\n    hedge:\n      \(entry)\n" + minimalRoute)
        #expect(found == ["portico.yaml:5 \(expected)"])
    }

    @Test("a bad min duration and a misspelt key")
    func minAndKeys() {
        let bad = diagnostics("middleware:\n  r:\n    type: retry\n    hedge:\n      min: fast\n" + minimalRoute)
        #expect(bad.count == 1 && bad[0].hasPrefix("portico.yaml:5 middleware.r.hedge.min: "))
        let misspelt = diagnostics("middleware:\n  r:\n    type: retry\n    hedge:\n      max_extras: 2\n" + minimalRoute)
        #expect(misspelt == ["portico.yaml:5 middleware.r.hedge.max_extras: unknown key \"max_extras\" (did you mean \"max_extra\"?)"])
    }
}
