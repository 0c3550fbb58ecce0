import Foundation
@testable import Portico
import Logging
import Testing

/// Issue #34: `endpoints`, `balance`, `outlier_detection`, `circuit_breaker` on an upstream.
@Suite("Resilience: configuration")
struct ResilienceConfigTests {
    @Test("a single url stays valid and means one endpoint; endpoints list several")
    func endpointsParse() throws {
        let config = try load("""
            upstreams:
              one: { url: "http://127.0.0.1:9000/api" }
              many:
                endpoints: [http://10.0.0.1:8080/api, "http://10.0.0.2:8080/api"]
                balance: least_request
                outlier_detection: { consecutive_failures: 3, base_ejection: 10s, max_ejection: 34%, failures: 5xx }
                circuit_breaker: { max_requests: 100, max_pending: 10 }
            \(minimalRoute)
            """)
        let one = try #require(config.upstreams["one"])
        #expect(one.endpoints == [URL(string: "http://127.0.0.1:9000/api")!])
        #expect(one.url == one.endpoints[0])
        #expect(one.circuitBreaker == nil)
        #expect(one.balance == .roundRobin)
        let many = try #require(config.upstreams["many"])
        #expect(many.endpoints.map(\.absoluteString) == ["http://10.0.0.1:8080/api", "http://10.0.0.2:8080/api"])
        #expect(many.url == many.endpoints[0])
        #expect(many.balance == .leastRequest)
        #expect(many.outlierDetection.consecutiveFailures == 3)
        #expect(many.outlierDetection.baseEjection == .seconds(10))
        #expect(abs(many.outlierDetection.maxEjection - 0.34) < 1e-9)
        #expect(many.outlierDetection.failures == .serverErrors)
        #expect(many.circuitBreaker?.maxRequests == 100)
        #expect(many.circuitBreaker?.maxPending == 10)
    }

    @Test("check refuses an empty endpoint list, url beside endpoints, mixed schemes, a repeated address, differing base paths")
    func endpointProblems() {
        #expect(diagnostics("""
            upstreams:
              a: { endpoints: [] }
              b: { url: "http://x:1", endpoints: ["http://y:1"] }
              c: { endpoints: ["http://x:1", "https://y:1"] }
              d: { endpoints: ["http://x:1", "http://x:1"] }
              e: { endpoints: ["http://x:1/a", "http://y:1/b"] }
              f: {}
            \(minimalRoute)
            """) == [
            "portico.yaml:2 upstreams.a.endpoints: lists no endpoint (an upstream needs at least one)",
            "portico.yaml:3 upstreams.b.url: give either url or endpoints, not both",
            "portico.yaml:4 upstreams.c.endpoints[1]: mixed schemes: https here, http in endpoints[0]",
            "portico.yaml:5 upstreams.d.endpoints[1]: endpoint x:1 is listed twice",
            #"portico.yaml:6 upstreams.e.endpoints[1]: base path "/b" differs from endpoints[0]'s "/a""#,
            #"portico.yaml:7 upstreams.f: missing required key "url""#,
        ])
    }

    @Test("check refuses thresholds out of range and unknown words, with file:line keypath messages")
    func thresholdsOutOfRange() {
        #expect(diagnostics("""
            upstreams:
              u:
                endpoints: ["http://x:1", "http://y:1"]
                balance: fastest
                outlier_detection: { consecutive_failures: 0, base_ejection: 0s, max_ejection: 150%, failures: all, x: 1 }
                circuit_breaker: { max_requests: 0, max_pending: -1 }
            \(minimalRoute)
            """) == [
            #"portico.yaml:4 upstreams.u.balance: expected one of round_robin, least_request, random, ewma, got "fastest""#,
            "portico.yaml:5 upstreams.u.outlier_detection.consecutive_failures: must be between 1 and 1000, got 0",
            "portico.yaml:5 upstreams.u.outlier_detection.base_ejection: must be greater than 0",
            #"portico.yaml:5 upstreams.u.outlier_detection.max_ejection: must be between 0% and 100%, got "150%""#,
            #"portico.yaml:5 upstreams.u.outlier_detection.failures: expected one of gateway, 5xx, got "all""#,
            #"portico.yaml:5 upstreams.u.outlier_detection.x: unknown key "x""#,
            "portico.yaml:6 upstreams.u.circuit_breaker.max_requests: must be between 1 and 1000000, got 0",
            "portico.yaml:6 upstreams.u.circuit_breaker.max_pending: must be between 0 and 1000000, got -1",
        ])
    }
}

@Suite("Resilience: explain names the endpoints")
struct ResilienceExplainTests {
    @Test("portico explain lists the upstream's endpoints and its balance")
    func explainNamesEndpoints() async throws {
        let runtime = try GatewayRuntime(config: try load("""
            upstreams:
              orders: { endpoints: ["http://10.0.0.1:8080", "http://10.0.0.2:8080"], balance: random }
            routes:
              - { name: orders, match: { path_prefix: /orders/ }, upstream: orders }
            """), logger: .init(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        let explanation = try Explanation(method: "GET", url: "http://x/orders/1", headers: [], runtime: runtime)
        #expect(explanation.upstreamEndpoints == ["10.0.0.1:8080", "10.0.0.2:8080"])
        #expect(explanation.balance == "random")
        #expect(explanation.text.contains("  endpoints (random): 10.0.0.1:8080, 10.0.0.2:8080"))
        await runtime.shutdown()
    }

    @Test("explain reads each endpoint's status from the running upstream and names those not up")
    func explainReadsStatus() async throws {
        let runtime = try GatewayRuntime(config: try load("""
            upstreams:
              orders: { endpoints: ["http://10.0.0.1:8080", "http://10.0.0.2:8080"] }
            routes:
              - { name: orders, match: { path_prefix: /orders/ }, upstream: orders }
            """), logger: .init(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        let upstream = try #require(runtime.upstreams["orders"] as? BalancedUpstream)
        let fresh = try Explanation(method: "GET", url: "http://x/orders/1", headers: [], runtime: runtime)
        #expect(fresh.endpointStatus == [.init(address: "10.0.0.1:8080", status: "up"), .init(address: "10.0.0.2:8080", status: "up")])
        #expect(!fresh.text.contains("10.0.0.2:8080: "))
        // The second endpoint fails consecutive_failures (5) times: the detector ejects it.
        for _ in 0..<5 {
            upstream.outlier.failed(upstream.endpoints[1], .connectFailed, at: upstream.outlier.moment(upstream.clock.now),
                                    among: upstream.endpoints)
        }
        let explanation = try Explanation(method: "GET", url: "http://x/orders/1", headers: [], runtime: runtime)
        #expect(explanation.endpointStatus == [.init(address: "10.0.0.1:8080", status: "up"),
                                              .init(address: "10.0.0.2:8080", status: "ejected", reason: "connect_failed")])
        #expect(explanation.text.contains("  10.0.0.2:8080: ejected (connect_failed)\n"))
        #expect(String(decoding: explanation.json, as: UTF8.self).contains("\"endpoint_status\""))
        await runtime.shutdown()
    }
}
