import Foundation

extension QuotaConfig {
    /// `type: quota`; `limit`, `per` and `store` are required.
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> QuotaConfig? {
        let limit = m.required("limit")?.int(in: 1...1_000_000_000_000)
        let per = m.required("per")?.choice(Period.self)
        // Asked for by hand: a missing store gets a reason, not only "missing required key".
        let storeNode = m.rawValue("store")
        var store: String?
        if let storeNode, !storeNode.isNull {
            store = storeNode.reference(to: "store", among: names.stores)
        } else {
            m.error("missing required key \"store\": a quota is counted in a shared store (stores.NAME, type: redis) "
                + "so that it survives restarts and holds across replicas")
        }
        var c = QuotaConfig(limit: limit ?? 1, per: per ?? .day, store: store ?? "")
        var valid = limit != nil && per != nil && store != nil
        m.read("key", into: &c.key) { $0.rateLimitKey() }
        m.read("timezone", into: &c.timeZone) { $0.quotaTimeZone() }
        m.read("on_store_error", into: &c.onStoreError) { $0.choice(StoreErrorPolicy.self) }
        m.read("headers", into: &c.headers) { $0.bool() }
        if let node = m.value("allocations") {
            if let (allocations, defaultShare) = node.quotaAllocations() {
                c.allocations = allocations
                c.defaultShare = defaultShare
                if c.key.isEmpty, !allocations.isEmpty {
                    node.context.report("needs key: (client_ip, route, header:NAME or a list): the key's value picks the allocation",
                                        path: node.path, line: node.ownLine)
                    valid = false
                }
            } else {
                valid = false
            }
        }
        if !c.key.isEmpty, c.allocations.isEmpty, let keyNode = m.value("key") {
            keyNode.warning("has no effect without allocations: every request draws from the one count of limit")
        }
        return valid ? c : nil
    }
}

extension ConfigNode {
    /// `allocations: { team-a: 60%, team-b: 40%, default: 0% }`: the listed keys in file order,
    /// and `default`'s share when given; at most 100 % together.
    func quotaAllocations() -> ([QuotaConfig.Allocation], Double?)? {
        guard let section = mapping() else { return nil }
        var allocations: [QuotaConfig.Allocation] = []
        var defaultShare: Double?
        var valid = true
        for entry in section.entries {
            guard let share = entry.value.percentage() else {
                valid = false
                continue
            }
            if entry.key == QuotaConfig.defaultAllocation {
                defaultShare = share
                continue
            }
            guard !entry.key.isEmpty else {
                entry.keyNode.error("an allocation needs a key's value")
                valid = false
                continue
            }
            guard entry.key.utf8.count <= QuotaConfig.maxAllocationKeyBytes, !entry.key.contains("\u{0}") else {
                entry.keyNode.error("an allocation key of more than \(QuotaConfig.maxAllocationKeyBytes) bytes never matches: "
                    + "longer key values are shortened to a hash")
                valid = false
                continue
            }
            allocations.append(QuotaConfig.Allocation(key: entry.key, share: share))
        }
        let total = allocations.reduce(defaultShare ?? 0) { $0 + $1.share }
        if total > 1 + 1e-9 {
            let shown = (total * 100 * 1000).rounded() / 1000
            let text = shown == shown.rounded() ? String(Int(shown)) : String(shown)
            section.error("allocations add up to \(text)%, over 100% of limit")
            valid = false
        }
        return valid ? (allocations, defaultShare) : nil
    }

    /// An IANA zone name (`Europe/Paris`, `UTC`) or a fixed offset from UTC (`+02:00`, `-05:30`).
    func quotaTimeZone() -> TimeZone? {
        guard let value = scalar(expected: "a time zone such as UTC, Europe/Paris or +02:00") else { return nil }
        let text = value.text
        if let first = text.first, first == "+" || first == "-" {
            let digits = text.dropFirst().split(separator: ":", omittingEmptySubsequences: false)
            guard digits.count == 2, digits.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isASCII) }),
                  let hours = Int(digits[0]), let minutes = Int(digits[1]),
                  hours <= 14, minutes < 60, hours * 60 + minutes <= 14 * 60,
                  let zone = TimeZone(secondsFromGMT: (first == "-" ? -1 : 1) * (hours * 3600 + minutes * 60)) else {
                error("expected a UTC offset from -14:00 to +14:00 such as +02:00, got \(value.shown)")
                return nil
            }
            return zone
        }
        if let zone = TimeZone(identifier: text) { return zone }
        let hint = value.shown.hasPrefix("value from") ? "" : NameSuggester.hint(for: text, in: TimeZone.knownTimeZoneIdentifiers)
        error("unknown time zone \(value.shown)\(hint); expected an IANA name such as Europe/Paris, UTC, or an offset such as +02:00")
        return nil
    }
}
