extension RetryConfig {
    /// The words `on:` accepts besides status codes.
    static let conditionWords = ["connect_error", "timeout", "reset"]

    /// `type: retry`. Listing `on` or `methods` replaces the default list.
    static func parse(_ m: ConfigMapping) -> RetryConfig? {
        var c = RetryConfig()
        m.read("attempts", into: &c.attempts) { $0.int(in: 1...10) }
        m.read("on", into: &c.on) { $0.retryConditions() }
        m.read("methods", into: &c.methods) { $0.methodList() }
        if let backoff = m.value("backoff")?.mapping() {
            backoff.read("base", into: &c.backoffBase) { $0.duration() }
            backoff.read("cap", into: &c.backoffCap) { $0.duration() }
            backoff.finish()
            if c.backoffCap < c.backoffBase {
                (backoff.value("cap") ?? backoff.node).error("must not be less than backoff.base")
            }
        }
        if let node = m.value("per_try_timeout"), let timeout = node.duration(positive: true) {
            c.perTryTimeout = timeout
        }
        m.read("budget", into: &c.budget) { $0.percentage() }
        m.read("min_retries_per_second", into: &c.minRetriesPerSecond) { $0.int(in: 0...100_000) }
        m.read("max_retry_after", into: &c.maxRetryAfter) { $0.duration() }
        if let node = m.value("hedge") {
            c.hedge = HedgeConfig.parse(node, methods: c.methods)
        }
        return c
    }
}

extension ConfigNode {
    /// `[connect_error, timeout, reset, 502, 503, 504, 429]`: words, 5xx, and 429. Other 4xx are
    /// refused: the upstream would give the same refusal again.
    func retryConditions() -> [RetryConfig.Condition]? {
        guard let items = list() else { return nil }
        var result: [RetryConfig.Condition] = []
        for item in items {
            guard let value = item.scalar(expected: "a retry condition") else { continue }
            let condition: RetryConfig.Condition
            if let code = Int(value.text) {
                guard (500...599).contains(code) || code == 429 else {
                    item.error("status \(code) cannot be retried (only 5xx and 429: other statuses would repeat the same answer)")
                    continue
                }
                condition = .status(code)
            } else {
                switch value.text {
                case "connect_error": condition = .connectError
                case "timeout": condition = .timeout
                case "reset": condition = .reset
                default:
                    let hint = value.shown.hasPrefix("value from") ? "" : NameSuggester.hint(for: value.text, in: RetryConfig.conditionWords)
                    item.error("unknown retry condition \(value.shown)\(hint); expected one of "
                        + RetryConfig.conditionWords.joined(separator: ", ") + " or a status (5xx, 429)")
                    continue
                }
            }
            if result.contains(condition) {
                item.error("duplicate retry condition \(condition.description.quotedForMessage)")
                continue
            }
            result.append(condition)
        }
        return result
    }
}
