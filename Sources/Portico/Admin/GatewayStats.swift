import Synchronization

/// What the dashboard draws, read from the metrics: per route the request rate, the share of
/// 5xx answers and latency quantiles over time, upstream errors by kind, caches, rate-limit
/// refusals and reloads. The admin listener samples the metrics every few seconds and keeps
/// the last minutes (`StatsHistory`); `GET /stats` answers a `StatsReport` from them.
struct StatsSnapshot: Sendable {
    struct RouteCounts: Sendable {
        var requests: Double = 0
        /// 5xx answers.
        var errors: Double = 0
        /// Cumulative latency histogram, upper bound (seconds) → count, over all methods.
        var buckets: [Double: Double] = [:]
    }

    struct CacheCounts: Sendable {
        var hits: Double = 0
        var misses: Double = 0
        var storedBytes: Double = 0
    }

    /// Seconds on the sampling clock.
    var time: Double
    var routes: [String: RouteCounts] = [:]
    var upstreamErrors: [String: [String: Double]] = [:]
    var caches: [String: CacheCounts] = [:]
    var rateLimited: [String: Double] = [:]
    var reloads: [String: Double] = [:]

    init(time: Double, samples: [PrometheusText.Sample]) {
        self.time = time
        for sample in samples {
            let labels = sample.labels
            switch sample.name {
            case "portico_requests_total":
                guard let route = labels["route"], !route.isEmpty else { continue }
                routes[route, default: RouteCounts()].requests += sample.value
                if let code = labels["code"].flatMap(Int.init), code >= 500 { routes[route, default: RouteCounts()].errors += sample.value }
            case "portico_request_duration_seconds_bucket":
                guard let route = labels["route"], !route.isEmpty, let bound = labels["le"].flatMap({ PrometheusText.number($0[...]) }) else { continue }
                routes[route, default: RouteCounts()].buckets[bound, default: 0] += sample.value
            case "portico_upstream_errors_total":
                guard let upstream = labels["upstream"], let kind = labels["kind"] else { continue }
                upstreamErrors[upstream, default: [:]][kind, default: 0] += sample.value
            case "portico_cache_hits_total":
                caches[labels["cache"] ?? "", default: CacheCounts()].hits += sample.value
            case "portico_cache_misses_total":
                caches[labels["cache"] ?? "", default: CacheCounts()].misses += sample.value
            case "portico_cache_stored_bytes":
                caches[labels["cache"] ?? "", default: CacheCounts()].storedBytes = sample.value
            case "portico_ratelimit_rejected_total":
                rateLimited[labels["route"] ?? "", default: 0] += sample.value
            case "portico_config_reloads_total":
                reloads[labels["result"] ?? "", default: 0] += sample.value
            default:
                continue
            }
        }
    }
}

/// The last `capacity` snapshots, oldest first.
final class StatsHistory: Sendable {
    private let snapshots = Mutex<[StatsSnapshot]>([])
    let capacity: Int

    init(capacity: Int = 60) {
        self.capacity = capacity
    }

    func record(_ snapshot: StatsSnapshot) {
        snapshots.withLock { list in
            list.append(snapshot)
            if list.count > capacity { list.removeFirst(list.count - capacity) }
        }
    }

    var all: [StatsSnapshot] { snapshots.withLock { $0 } }
}

/// `GET /stats`.
struct StatsReport: Sendable, Encodable {
    /// One interval between two snapshots.
    struct Point: Sendable, Encodable {
        /// Seconds before now at the interval's end (0: now).
        var ago: Double
        /// Requests per second.
        var rate: Double
        /// 5xx answers over all answers; `nil` without requests.
        var errorRatio: Double?
        var p50Ms: Double?
        var p99Ms: Double?

        enum CodingKeys: String, CodingKey {
            case ago, rate
            case errorRatio = "error_ratio", p50Ms = "p50_ms", p99Ms = "p99_ms"
        }
    }

    struct RouteStats: Sendable, Encodable {
        var name: String
        var requestsTotal: Double
        /// Over the last `windowSeconds`.
        var current: Point
        var series: [Point]

        enum CodingKeys: String, CodingKey {
            case name, current, series
            case requestsTotal = "requests_total"
        }
    }

    struct UpstreamStats: Sendable, Encodable {
        var name: String
        var errors: [String: Double]
    }

    struct CacheStats: Sendable, Encodable {
        var name: String
        var hits: Double
        var misses: Double
        var hitRatio: Double?
        var storedBytes: Double

        enum CodingKeys: String, CodingKey {
            case name, hits, misses
            case hitRatio = "hit_ratio", storedBytes = "stored_bytes"
        }
    }

    var windowSeconds: Double
    var routes: [RouteStats]
    var upstreams: [UpstreamStats]
    var caches: [CacheStats]
    /// 429s by route.
    var rateLimited: [String: Double]
    var reloads: [String: Double]
    var lastReload: ReloadRecord?

    enum CodingKeys: String, CodingKey {
        case routes, upstreams, caches, reloads
        case windowSeconds = "window_seconds", rateLimited = "rate_limited", lastReload = "last_reload"
    }

    /// From the history and a snapshot taken now; `routeNames` in table order (routes without
    /// traffic yet are listed too), `window`: how far back `current` looks.
    init(history: [StatsSnapshot], now: StatsSnapshot, routeNames: [String], window: Double = 60,
         lastReload: ReloadRecord?) {
        let points = history.filter { $0.time < now.time } + [now]
        let base = points.last { $0.time <= now.time - window } ?? points.first ?? now
        windowSeconds = now.time - base.time
        routes = routeNames.map { name in
            let series = zip(points, points.dropFirst()).map { Self.point(name, from: $0, to: $1, now: now.time) }
            return RouteStats(name: name, requestsTotal: now.routes[name]?.requests ?? 0,
                              current: Self.point(name, from: base, to: now, now: now.time), series: series)
        }
        upstreams = now.upstreamErrors.keys.sorted().map { UpstreamStats(name: $0, errors: now.upstreamErrors[$0] ?? [:]) }
        caches = now.caches.keys.sorted().map { name in
            let counts = now.caches[name]!
            let lookups = counts.hits + counts.misses
            return CacheStats(name: name, hits: counts.hits, misses: counts.misses,
                              hitRatio: lookups > 0 ? counts.hits / lookups : nil, storedBytes: counts.storedBytes)
        }
        rateLimited = now.rateLimited
        reloads = now.reloads
        self.lastReload = lastReload
    }

    static func point(_ route: String, from old: StatsSnapshot, to new: StatsSnapshot, now: Double) -> Point {
        let before = old.routes[route] ?? .init(), after = new.routes[route] ?? .init()
        let elapsed = new.time - old.time
        let requests = max(0, after.requests - before.requests)
        let errors = max(0, after.errors - before.errors)
        let buckets = after.buckets.map { ($0.key, max(0, $0.value - (before.buckets[$0.key] ?? 0))) }.sorted { $0.0 < $1.0 }
        return Point(ago: now - new.time, rate: elapsed > 0 ? requests / elapsed : 0,
                     errorRatio: requests > 0 ? errors / requests : nil,
                     p50Ms: quantile(0.5, buckets).map { $0 * 1000 }, p99Ms: quantile(0.99, buckets).map { $0 * 1000 })
    }

    /// `histogram_quantile`: linear within the bucket the rank falls in; the largest finite
    /// bound when it falls in `+Inf`. `buckets`: (upper bound, cumulative count), ascending.
    static func quantile(_ q: Double, _ buckets: [(Double, Double)]) -> Double? {
        guard let total = buckets.last?.1, total > 0 else { return nil }
        let rank = q * total
        var lower = (bound: 0.0, count: 0.0)
        for (bound, count) in buckets {
            if count >= rank {
                guard bound.isFinite else { return lower.bound }
                let inBucket = count - lower.count
                return inBucket > 0 ? lower.bound + (bound - lower.bound) * (rank - lower.count) / inBucket : bound
            }
            lower = (bound, count)
        }
        return lower.bound
    }
}
