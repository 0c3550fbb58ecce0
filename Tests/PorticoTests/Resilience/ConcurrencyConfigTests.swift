import Foundation
@testable import Portico
import Testing

/// Issue #44: `balance: ewma`, `concurrency: N | adaptive` and `adaptive_concurrency` on an upstream.
@Suite("Resilience: concurrency configuration")
struct ConcurrencyConfigTests {
    @Test("concurrency: adaptive with its section; a number is circuit_breaker.max_requests; ewma is a balance word")
    func parses() throws {
        let config = try load("""
            upstreams:
              vendor:
                endpoints: [http://10.0.0.1:8080, http://10.0.0.2:8080]
                balance: ewma
                concurrency: adaptive
                adaptive_concurrency: { min: 8, max: 500, sample_window: 100ms, target_latency: min_rtt × 2 }
              plain: { url: "http://10.0.0.3:8080", concurrency: adaptive }
              fixed: { url: "http://10.0.0.4:8080", concurrency: 16, circuit_breaker: { max_pending: 5 } }
              latency: { url: "http://10.0.0.5:8080", concurrency: adaptive, adaptive_concurrency: { target_latency: 200ms } }
              starred: { url: "http://10.0.0.6:8080", concurrency: adaptive, adaptive_concurrency: { target_latency: "min_rtt*1.25" } }
            \(minimalRoute)
            """)
        let vendor = try #require(config.upstreams["vendor"])
        #expect(vendor.balance == .ewma)
        let adaptive = try #require(vendor.adaptiveConcurrency)
        #expect(adaptive.min == 8 && adaptive.max == 500)
        #expect(adaptive.sampleWindow == .milliseconds(100))
        #expect(adaptive.target == .minimumTimes(2))
        #expect(vendor.circuitBreaker == nil)
        #expect(config.upstreams["plain"]?.adaptiveConcurrency == AdaptiveConcurrencyConfig())
        let fixed = try #require(config.upstreams["fixed"])
        #expect(fixed.adaptiveConcurrency == nil)
        #expect(fixed.circuitBreaker?.maxRequests == 16)
        #expect(fixed.circuitBreaker?.maxPending == 5)
        #expect(config.upstreams["latency"]?.adaptiveConcurrency?.target == .fixed(.milliseconds(200)))
        #expect(config.upstreams["starred"]?.adaptiveConcurrency?.target == .minimumTimes(1.25))
        // The defaults: min 4, max 1000, 250 ms windows, min_rtt × 1.5, starting at min.
        let defaults = AdaptiveConcurrencyConfig()
        #expect(defaults.min == 4 && defaults.max == 1000 && defaults.sampleWindow == .milliseconds(250))
        #expect(defaults.target == .minimumTimes(1.5) && defaults.initial == 4)
    }

    @Test("check refuses min above max, unknown words and keys, and adaptive_concurrency without concurrency: adaptive")
    func refuses() {
        #expect(diagnostics("""
            upstreams:
              a: { url: "http://x:1", concurrency: adaptive, adaptive_concurrency: { min: 50, max: 10 } }
              b: { url: "http://x:2", concurrency: adaptve }
              c: { url: "http://x:3", adaptive_concurrency: { min: 2 } }
              d: { url: "http://x:4", concurrency: 8, circuit_breaker: { max_requests: 9 } }
              e: { url: "http://x:5", concurrency: adaptive, adaptive_concurrency: { target_latency: min_rtt × 50 } }
              f: { url: "http://x:6", concurrency: adaptive, adaptive_concurrency: { target_latency: p99, window: 1s } }
              g: { url: "http://x:7", balance: peak_ewma }
              h: { url: "http://x:8", concurrency: 8, adaptive_concurrency: { min: 2 } }
            \(minimalRoute)
            """) == [
            "portico.yaml:2 upstreams.a.adaptive_concurrency.min: must not be above max (10), got 50",
            #"portico.yaml:3 upstreams.b.concurrency: expected adaptive or a number of requests, got "adaptve""#,
            "portico.yaml:4 upstreams.c.adaptive_concurrency: applies with concurrency: adaptive",
            "portico.yaml:5 upstreams.d.concurrency: give either concurrency or circuit_breaker.max_requests, not both",
            #"portico.yaml:6 upstreams.e.adaptive_concurrency.target_latency: the factor must be between 1 and 10, got "min_rtt × 50""#,
            #"portico.yaml:7 upstreams.f.adaptive_concurrency.target_latency: invalid duration "p99" (expected e.g. 250ms, 10s, 5m)"#,
            #"portico.yaml:7 upstreams.f.adaptive_concurrency.window: unknown key "window""#,
            #"portico.yaml:8 upstreams.g.balance: expected one of round_robin, least_request, random, ewma, got "peak_ewma""#,
            "portico.yaml:9 upstreams.h.adaptive_concurrency: applies with concurrency: adaptive, not a fixed number",
        ])
    }
}
