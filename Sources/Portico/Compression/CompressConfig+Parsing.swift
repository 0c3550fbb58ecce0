extension CompressConfig {
    /// `type: compress`; every key is optional.
    static func parse(_ m: ConfigMapping) -> CompressConfig? {
        var c = CompressConfig()
        m.read("level", into: &c.level) { $0.int(in: 1...9) }
        m.read("min_bytes", into: &c.minBytes) { $0.size(minimum: 0) }
        m.read("types", into: &c.types) { $0.mediaTypePatterns() }
        m.read("window_bits", into: &c.windowBits) { $0.int(in: 9...15) }
        m.read("mem_level", into: &c.memLevel) { $0.int(in: 1...9) }
        return c
    }
}

extension ConfigNode {
    /// A non-empty list of `type/subtype`, `type/*`, `*/*+suffix` or `*/*`, without duplicates.
    func mediaTypePatterns() -> [MediaTypePattern]? {
        guard let items = list() else { return nil }
        var patterns: [MediaTypePattern] = []
        var failed = false
        for item in items {
            guard let value = item.scalar() else {
                failed = true
                continue
            }
            guard let pattern = MediaTypePattern(value.text) else {
                item.error("invalid media type \(value.shown); expected type/subtype, type/*, */*+suffix or */*")
                failed = true
                continue
            }
            if patterns.contains(pattern) {
                item.error("duplicate media type \(pattern.description.quotedForMessage)")
                continue
            }
            patterns.append(pattern)
        }
        if failed { return nil }
        guard !patterns.isEmpty else {
            error("must list at least one media type")
            return nil
        }
        return patterns
    }
}
