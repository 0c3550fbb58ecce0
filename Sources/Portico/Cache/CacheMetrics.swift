import CoreMetrics
import Metrics

/// One cache instance's metric handles, made once when the runtime is built. Labels are the
/// instance's configured name and small fixed sets, so the series count stays bounded.
public final class CacheMetrics: Sendable {
    let hits: Counter
    let misses: Counter
    let staleServed: [String: Counter]
    let revalidations: [String: Counter]
    let coalesced: Counter
    let evictions: Counter
    let storedBytes: Gauge

    static let staleReasons = ["stale_while_revalidate", "stale_if_error", "max_stale"]
    static let revalidationResults = ["not_modified", "modified", "failed"]

    public init(cache: String, factory: any MetricsFactory = MetricsSystem.factory) {
        let dimensions = [("cache", cache)]
        hits = Counter(label: "portico_cache_hits_total", dimensions: dimensions, factory: factory)
        misses = Counter(label: "portico_cache_misses_total", dimensions: dimensions, factory: factory)
        staleServed = Dictionary(uniqueKeysWithValues: Self.staleReasons.map {
            ($0, Counter(label: "portico_cache_stale_served_total", dimensions: dimensions + [("reason", $0)], factory: factory))
        })
        revalidations = Dictionary(uniqueKeysWithValues: Self.revalidationResults.map {
            ($0, Counter(label: "portico_cache_revalidations_total", dimensions: dimensions + [("result", $0)], factory: factory))
        })
        coalesced = Counter(label: "portico_cache_coalesced_total", dimensions: dimensions, factory: factory)
        evictions = Counter(label: "portico_cache_evictions_total", dimensions: dimensions, factory: factory)
        storedBytes = Gauge(label: "portico_cache_stored_bytes", dimensions: dimensions, factory: factory)
    }

    func stale(_ reason: String) { staleServed[reason]?.increment() }
    func revalidated(_ result: String) { revalidations[result]?.increment() }

    func record(_ change: CacheStoreChange) {
        if change.evictions > 0 { evictions.increment(by: change.evictions) }
        storedBytes.record(change.storedBytes)
    }
}
