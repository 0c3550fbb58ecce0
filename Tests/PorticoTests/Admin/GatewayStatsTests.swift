import Testing
@testable import Portico

@Suite("GET /stats: the dashboard's numbers from the metrics")
struct GatewayStatsTests {
    @Test("Prometheus text lines parse: labels with escapes, +Inf, timestamps; comments are skipped")
    func parse() {
        let text = """
            # HELP portico_requests_total Requests.
            # TYPE portico_requests_total counter
            portico_requests_total{route="orders",method="GET",code="200"} 12
            portico_request_duration_seconds_bucket{route="a \\"b\\"",le="+Inf"} 3 1700000000
            portico_build_info 1

            """
        let samples = PrometheusText.parse(Array(text.utf8))
        #expect(samples == [
            .init(name: "portico_requests_total", labels: ["route": "orders", "method": "GET", "code": "200"], value: 12),
            .init(name: "portico_request_duration_seconds_bucket", labels: ["route": "a \"b\"", "le": "+Inf"], value: 3),
            .init(name: "portico_build_info", labels: [:], value: 1),
        ])
    }

    static func exposition(requests: Int, errors: Int, fast: Int, hits: Int, misses: Int, bytes: Int, rejected: Int) -> [UInt8] {
        Array("""
            portico_requests_total{route="orders",method="GET",code="200"} \(requests - errors)
            portico_requests_total{route="orders",method="GET",code="503"} \(errors)
            portico_requests_total{route="",method="GET",code="404"} 7
            portico_request_duration_seconds_bucket{route="orders",method="GET",le="0.01"} \(fast)
            portico_request_duration_seconds_bucket{route="orders",method="GET",le="0.1"} \(requests)
            portico_request_duration_seconds_bucket{route="orders",method="GET",le="+Inf"} \(requests)
            portico_upstream_errors_total{upstream="orders",kind="upstream_timeout"} \(errors)
            portico_cache_hits_total{cache="cache"} \(hits)
            portico_cache_misses_total{cache="cache"} \(misses)
            portico_cache_stored_bytes{cache="cache"} \(bytes)
            portico_ratelimit_rejected_total{route="orders"} \(rejected)
            portico_config_reloads_total{result="failure"} 1

            """.utf8)
    }

    @Test("rates, 5xx share and quantiles come from the differences between snapshots; totals from the last")
    func report() throws {
        let first = StatsSnapshot(time: 100, samples: PrometheusText.parse(Self.exposition(
            requests: 10, errors: 0, fast: 10, hits: 0, misses: 0, bytes: 0, rejected: 0)))
        let second = StatsSnapshot(time: 105, samples: PrometheusText.parse(Self.exposition(
            requests: 60, errors: 5, fast: 35, hits: 3, misses: 1, bytes: 2048, rejected: 2)))
        let now = StatsSnapshot(time: 110, samples: PrometheusText.parse(Self.exposition(
            requests: 60, errors: 5, fast: 35, hits: 3, misses: 1, bytes: 2048, rejected: 2)))
        let report = StatsReport(history: [first, second], now: now, routeNames: ["orders", "idle"], lastReload: nil)
        let orders = try #require(report.routes.first)
        #expect(report.routes.map(\.name) == ["orders", "idle"])
        #expect(orders.requestsTotal == 60)
        #expect(orders.series.count == 2)
        let busy = orders.series[0]
        #expect(busy.ago == 5 && busy.rate == 10 && busy.errorRatio == 0.1)
        // 50 requests: 25 within 10 ms, 25 more within 100 ms. The median is at the 10 ms bound,
        // the 99th percentile interpolated in the second bucket: 10 + 90 × (49.5 − 25) / 25 ms.
        #expect(busy.p50Ms.map { abs($0 - 10) < 1e-9 } == true)
        #expect(busy.p99Ms.map { abs($0 - 98.2) < 1e-9 } == true)
        let quiet = orders.series[1]
        #expect(quiet.rate == 0 && quiet.errorRatio == nil && quiet.p50Ms == nil)
        #expect(orders.current.rate == 5 && report.windowSeconds == 10)
        #expect(report.routes[1].requestsTotal == 0 && report.routes[1].current.rate == 0)
        #expect(report.upstreams.first?.errors == ["upstream_timeout": 5])
        #expect(report.caches.first?.hitRatio == 0.75 && report.caches.first?.storedBytes == 2048)
        #expect(report.rateLimited == ["orders": 2] && report.reloads == ["failure": 1])
    }

    @Test("the quantile of an empty histogram is none; one in +Inf is the largest finite bound")
    func quantileEdges() {
        #expect(StatsReport.quantile(0.5, []) == nil)
        #expect(StatsReport.quantile(0.5, [(0.1, 0), (.infinity, 0)]) == nil)
        #expect(StatsReport.quantile(0.99, [(0.1, 1), (.infinity, 10)]) == 0.1)
    }

    @Test("the history keeps the newest snapshots only")
    func historyBounded() {
        let history = StatsHistory(capacity: 3)
        for time in 1...5 { history.record(StatsSnapshot(time: Double(time), samples: [])) }
        #expect(history.all.map(\.time) == [3, 4, 5])
    }
}
