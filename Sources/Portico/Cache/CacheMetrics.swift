import CoreMetrics
import Metrics

/// One cache instance's metric handles, made once when the runtime is built. Labels are the
/// instance's configured name and small fixed sets, so the series count stays bounded.
public final class CacheMetrics: Sendable {
    let hits: Counter
    let misses: Counter
    let staleServed: [StaleReason: Counter]
    let revalidations: [RevalidationResult: Counter]
    let coalesced: Counter
    let evictions: Counter
    let storedBytes: Gauge

    /// Why a stale response was served; the `reason` label of `portico_cache_stale_served_total`.
    enum StaleReason: String, Sendable, CaseIterable {
        /// Served while a background refresh runs (RFC 5861).
        case staleWhileRevalidate = "stale_while_revalidate"
        /// The upstream failed and the response allows it (RFC 5861).
        case staleIfError = "stale_if_error"
        /// The client's `max-stale` accepts it.
        case maxStale = "max_stale"
    }

    /// How a validation with the upstream ended; the `result` label of
    /// `portico_cache_revalidations_total`.
    enum RevalidationResult: String, Sendable, CaseIterable {
        /// 304: the stored response was freshened.
        case notModified = "not_modified"
        /// A new full response replaced it.
        case modified
        /// No answer, or a server error.
        case failed
    }

    public init(cache: String, factory: any MetricsFactory = MetricsSystem.factory) {
        let dimensions = [("cache", cache)]
        hits = Counter(label: "portico_cache_hits_total", dimensions: dimensions, factory: factory)
        misses = Counter(label: "portico_cache_misses_total", dimensions: dimensions, factory: factory)
        staleServed = Dictionary(uniqueKeysWithValues: StaleReason.allCases.map {
            ($0, Counter(label: "portico_cache_stale_served_total", dimensions: dimensions + [("reason", $0.rawValue)], factory: factory))
        })
        revalidations = Dictionary(uniqueKeysWithValues: RevalidationResult.allCases.map {
            ($0, Counter(label: "portico_cache_revalidations_total", dimensions: dimensions + [("result", $0.rawValue)], factory: factory))
        })
        coalesced = Counter(label: "portico_cache_coalesced_total", dimensions: dimensions, factory: factory)
        evictions = Counter(label: "portico_cache_evictions_total", dimensions: dimensions, factory: factory)
        storedBytes = Gauge(label: "portico_cache_stored_bytes", dimensions: dimensions, factory: factory)
    }

    func stale(_ reason: StaleReason) { staleServed[reason]?.increment() }
    func revalidated(_ result: RevalidationResult) { revalidations[result]?.increment() }

    /// A change that changed nothing records nothing: an unsafe request's invalidation of a key
    /// never stored must not write the gauge, a line every thread would write.
    func record(_ change: CacheStoreChange) {
        guard change.changed else { return }
        if change.evictions > 0 { evictions.increment(by: change.evictions) }
        storedBytes.record(change.storedBytes)
    }
}
