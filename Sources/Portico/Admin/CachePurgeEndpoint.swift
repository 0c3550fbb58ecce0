import MicroHTTPD
import RedisClient

/// `POST /cache/purge`: drops cached responses on purpose — by `url`, path `prefix` (with an
/// optional `host`) or `tag` (the upstream's `Surrogate-Key` / `Cache-Tag`), in every cache
/// middleware or the one named by `cache`. `scope: fleet` (the default for a cache with a
/// store) deletes in Redis too and reaches every replica's memory within a second; `local`
/// empties this replica's memory only.
struct CachePurgeEndpoint {
    static let purges = LabelledCounters("portico_cache_purges_total")

    struct Report: Encodable {
        struct Cache: Encodable {
            var name: String
            var scope: String
            /// Keys dropped from this replica's memory.
            var memory: Int
            /// Keys deleted in Redis (`fleet` scope), when the store answered.
            var store: Int?
        }

        var caches: [Cache]
    }

    let runtime: GatewayRuntime

    func answer(_ body: [UInt8]) async -> ServerResponse {
        let target: CachePurgeTarget
        let scope: CachePurgeTarget.Scope?
        let cacheName: String?
        do throws(CachePurgeTarget.RequestError) {
            (target, scope, cacheName) = try CachePurgeTarget.parse(body)
        } catch {
            return AdminEndpoints.json(400, ["error": "bad_request", "message": error.description])
        }
        let caches = runtime.caches.filter { cacheName == nil || $0.name == cacheName }.sorted { $0.name < $1.name }
        if let cacheName, caches.isEmpty {
            let known = runtime.caches.map(\.name).sorted()
            return AdminEndpoints.json(404, ["error": "not_found",
                                             "message": "no cache middleware \"\(cacheName)\"; caches: \(known.isEmpty ? "none" : known.joined(separator: ", "))"])
        }
        if scope == .fleet, let lacking = caches.first(where: { $0.tiers == nil }) {
            return AdminEndpoints.json(400, ["error": "bad_request",
                                             "message": "scope fleet needs a cache with store:; \(lacking.name) has none (use scope local)"])
        }
        var report = Report(caches: [])
        var failed: [String] = []
        for cache in caches {
            let fleet = cache.tiers.flatMap { scope == .local ? nil : $0 }
            let memory = (cache.tiers?.memory ?? cache.store as? InMemoryCacheStore)
            let (removed, change) = memory?.removeAll(matching: target) ?? (0, CacheStoreChange(evictions: 0, storedBytes: 0, changed: false))
            cache.metrics.record(change)
            var entry = Report.Cache(name: cache.name, scope: fleet == nil ? "local" : "fleet", memory: removed)
            if let fleet {
                do throws(RedisError) {
                    entry.store = try await fleet.fleet.purge(target)
                } catch {
                    failed.append(cache.name)
                }
            }
            Self.purges.increment([("cache", cache.name), ("scope", entry.scope), ("target", target.kind)])
            report.caches.append(entry)
        }
        guard failed.isEmpty else {
            return AdminEndpoints.json(503, ["error": "store_unavailable",
                                             "message": "purged this replica's memory, but the store did not answer for \(failed.joined(separator: ", ")); other replicas still hold what they held: try again"])
        }
        return AdminEndpoints.json(200, report)
    }
}

extension CachePurgeTarget {
    /// The `target` label of `portico_cache_purges_total`.
    var kind: String {
        switch self {
        case .key: "url"
        case .prefix: "prefix"
        case .tag: "tag"
        }
    }
}
