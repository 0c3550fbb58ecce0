import HTTPTypes

extension CacheConfig {
    /// `type: cache`.
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> CacheConfig? {
        var c = CacheConfig()
        m.read("max_bytes", into: &c.maxBytes) { $0.size(minimum: 1024) }
        m.read("max_object_bytes", into: &c.maxObjectBytes) { $0.size() }
        m.read("heuristic_fraction", into: &c.heuristicFraction) { $0.percentage() }
        m.read("heuristic_max", into: &c.heuristicMax) { $0.duration() }
        m.read("stale_while_revalidate", into: &c.staleWhileRevalidate) { $0.duration() }
        m.read("stale_if_error", into: &c.staleIfError) { $0.duration() }
        if let node = m.value("revalidation_timeout"), let timeout = node.duration(positive: true) {
            c.revalidationTimeout = timeout
        }
        m.read("max_in_flight", into: &c.maxInFlight) { $0.int(in: 1...1_000_000) }
        m.read("x_cache", into: &c.xCache) { $0.bool() }
        m.read("targeted_cache_control", into: &c.targetedCacheControl) { $0.targetedFieldNames() }
        m.read("store", into: &c.store) { $0.reference(to: "store", among: names.stores) }
        m.read("max_entry_bytes", into: &c.maxEntryBytes) { $0.size() }
        m.read("store_wait", into: &c.storeWait) { $0.duration(positive: true) }
        for key in ["max_entry_bytes", "store_wait"] where m.value("store") == nil {
            m.value(key)?.error("applies only with store: NAME (the fleet tier)")
        }
        if c.maxObjectBytes > c.maxBytes {
            (m.value("max_object_bytes") ?? m.value("max_bytes") ?? m.node).error("must not be greater than max_bytes")
        }
        return c
    }
}

extension ConfigNode {
    /// `targeted_cache_control`: distinct field names, `Cache-Control` itself excluded.
    fileprivate func targetedFieldNames() -> [HTTPField.Name]? {
        guard let items = list() else { return nil }
        var names: [HTTPField.Name] = []
        for item in items {
            guard let text = item.headerName(), let name = HTTPField.Name(text) else { continue }
            if name == .cacheControl {
                item.error("Cache-Control is what targeted fields take precedence over; list only targeted fields such as CDN-Cache-Control")
            } else if names.contains(name) {
                item.error("\(text) is listed twice")
            } else {
                names.append(name)
            }
        }
        return names
    }
}
