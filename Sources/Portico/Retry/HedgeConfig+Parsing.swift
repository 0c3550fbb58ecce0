extension HedgeConfig {
    /// `hedge: { after: p90 | 50ms, min: 20ms, max_extra: 1 }`. Refused when the retry's `methods`
    /// list a method that is not idempotent: a hedge sends a request while its twin is still
    /// in flight, so both may reach the upstream.
    static func parse(_ node: ConfigNode, methods: [String]) -> HedgeConfig? {
        guard let m = node.mapping() else { return nil }
        var c = HedgeConfig()
        m.read("after", into: &c.after) { $0.hedgeDelay() }
        m.read("min", into: &c.min) { $0.duration() }
        m.read("max_extra", into: &c.maxExtra) { $0.int(in: 1...3) }
        m.finish()
        let unsafe = methods.filter { !idempotentMethods.contains($0) }
        if !unsafe.isEmpty {
            let listed = unsafe.map(\.quotedForMessage).joined(separator: ", ")
            node.error("hedging needs idempotent methods, but methods lists \(listed): a hedge is sent while "
                + "the first attempt may still be acting upstream (remove \(unsafe.count == 1 ? "it" : "them") from methods, or drop hedge)")
            return nil
        }
        return c
    }
}

extension ConfigNode {
    /// `p90`, `p99.9` (a percentile from 50 to 99.9) or a positive duration.
    func hedgeDelay() -> HedgeConfig.Delay? {
        guard let value = scalar(expected: "a percentile (p50-p99.9) or a duration") else { return nil }
        let text = value.text
        if text.hasPrefix("p") || text.hasPrefix("P") {
            let digits = text.dropFirst()
            guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }),
                  let percentile = Double(digits) else {
                error("expected a percentile such as p90 or a duration such as 50ms, got \(value.shown)")
                return nil
            }
            guard HedgeConfig.percentiles.contains(percentile) else {
                error("percentile must be between p50 and p99.9, got \(value.shown)")
                return nil
            }
            return .percentile(percentile)
        }
        guard let delay = duration(positive: true) else { return nil }
        return .fixed(delay)
    }
}
