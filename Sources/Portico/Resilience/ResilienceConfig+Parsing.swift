// The resilience sections of `upstreams.NAME` (`outlier_detection`, `circuit_breaker`,
// `health_check`), next to their types; `UpstreamConfig.parse` calls them.

extension OutlierDetectionConfig {
    /// `upstreams.NAME.outlier_detection`
    static func parse(_ m: ConfigMapping) -> OutlierDetectionConfig {
        var c = OutlierDetectionConfig()
        m.read("consecutive_failures", into: &c.consecutiveFailures) { $0.int(in: 1...1000) }
        m.read("base_ejection", into: &c.baseEjection) { $0.duration(positive: true) }
        m.read("max_ejection", into: &c.maxEjection) { $0.percentage() }
        m.read("failures", into: &c.failures) { $0.choice(Failures.self) }
        m.finish()
        return c
    }
}

extension CircuitBreakerConfig {
    /// `upstreams.NAME.circuit_breaker`
    static func parse(_ m: ConfigMapping) -> CircuitBreakerConfig {
        var c = CircuitBreakerConfig()
        m.read("max_requests", into: &c.maxRequests) { $0.int(in: 1...1_000_000) }
        m.read("max_pending", into: &c.maxPending) { $0.int(in: 0...1_000_000) }
        m.finish()
        return c
    }
}

extension HealthCheckConfig {
    /// `upstreams.NAME.health_check`; nil without a usable `path`.
    static func parse(_ m: ConfigMapping) -> HealthCheckConfig? {
        var path: String?
        if let node = m.required("path"), let text = node.nonEmptyString() {
            if text.hasPrefix("/") && HTTPSyntax.urlProblem("http://x" + text, allowQuery: true) == nil {
                path = text
            } else {
                node.error("expected an absolute path such as /healthz, got \(text.quotedForMessage)")
            }
        }
        var c = HealthCheckConfig(path: path ?? "/")
        m.read("interval", into: &c.interval) { $0.duration(positive: true) }
        m.read("timeout", into: &c.timeout) { $0.duration(positive: true) }
        m.read("healthy", into: &c.healthy) { $0.int(in: 1...100) }
        m.read("unhealthy", into: &c.unhealthy) { $0.int(in: 1...100) }
        m.read("expect", into: &c.expect) { $0.statusRange() }
        if c.timeout > c.interval, let node = m.value("timeout") {
            node.error("must not be longer than interval (\(c.interval))")
        }
        m.finish()
        return path == nil ? nil : c
    }
}

extension ConfigNode {
    /// `200-399` or `200`: statuses between 100 and 599.
    func statusRange() -> ClosedRange<Int>? {
        guard let value = scalar(expected: "a status or a range such as 200-399") else { return nil }
        let parts = value.text.split(separator: "-", omittingEmptySubsequences: false)
            .map { Int($0.trimmingCharacters(in: .whitespaces)) }
        guard (1...2).contains(parts.count), let low = parts.first ?? nil, let high = parts.last ?? nil,
              (100...599).contains(low), (100...599).contains(high), low <= high else {
            error("expected a status or a range of statuses such as 200-399 (100 to 599), got \(value.shown)")
            return nil
        }
        return low...high
    }
}

extension AdaptiveConcurrencyConfig {
    /// `upstreams.NAME.adaptive_concurrency`
    static func parse(_ m: ConfigMapping) -> AdaptiveConcurrencyConfig {
        var c = AdaptiveConcurrencyConfig()
        m.read("min", into: &c.min) { $0.int(in: 1...1_000_000) }
        m.read("max", into: &c.max) { $0.int(in: 1...1_000_000) }
        m.read("sample_window", into: &c.sampleWindow) { $0.duration(positive: true) }
        m.read("target_latency", into: &c.target) { $0.latencyTarget() }
        if c.min > c.max, let node = m.value("min") {
            node.error("must not be above max (\(c.max)), got \(c.min)")
            c.min = c.max
        }
        if c.sampleWindow < .milliseconds(10), let node = m.value("sample_window") {
            node.error("must be at least 10ms (a window needs answers in it)")
            c.sampleWindow = .milliseconds(10)
        }
        m.finish()
        return c
    }
}

extension ConfigNode {
    /// `min_rtt × 1.5` (or `min_rtt * 1.5`, a factor from 1 to 10), or a duration such as `200ms`.
    func latencyTarget() -> AdaptiveConcurrencyConfig.Target? {
        guard let value = scalar(expected: "min_rtt × FACTOR or a duration") else { return nil }
        let text = value.text.trimmingCharacters(in: .whitespaces)
        if text.hasPrefix("min_rtt") {
            let rest = text.dropFirst("min_rtt".count).trimmingCharacters(in: .whitespaces)
            let factorText = rest.hasPrefix("×") || rest.hasPrefix("*") ? rest.dropFirst().trimmingCharacters(in: .whitespaces) : nil
            guard let factorText, let factor = Double(factorText), factor.isFinite else {
                error("expected min_rtt × FACTOR (such as min_rtt × 1.5) or a duration, got \(value.shown)")
                return nil
            }
            guard (1...10).contains(factor) else {
                error("the factor must be between 1 and 10, got \(value.shown)")
                return nil
            }
            return .minimumTimes(factor)
        }
        guard let duration = duration(positive: true) else { return nil }
        return .fixed(duration)
    }
}
