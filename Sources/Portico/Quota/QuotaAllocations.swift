/// One allocation of a quota as counted: a listed key's share, or the pool every other key
/// shares (`default`). Its name is from the configuration, so it may be a metric label and part
/// of a store key; the request's own key value never is either.
public struct QuotaAllocation: Sendable, Equatable {
    /// Its place in `QuotaAllocations.all`, where the local counts keep it.
    public let index: Int
    /// The allocation's key (`team-a`), or `default` for the pool.
    public let name: String
    /// Requests per window.
    public let limit: Int

    public init(index: Int, name: String, limit: Int) {
        self.index = index
        self.name = name
        self.limit = limit
    }
}

/// A quota's allocations, resolved once from its settings: the listed keys, then the pool.
public struct QuotaAllocations: Sendable, Equatable {
    /// Listed allocations in file order, the pool last.
    public let all: [QuotaAllocation]
    private let byKey: [String: Int]

    public init(_ config: QuotaConfig) {
        var all: [QuotaAllocation] = []
        var byKey: [String: Int] = [:]
        for allocation in config.allocations {
            byKey[allocation.key] = all.count
            all.append(QuotaAllocation(index: all.count, name: allocation.key,
                                       limit: QuotaConfig.share(allocation.share, of: config.limit)))
        }
        let listed = all.reduce(0) { $0 + $1.limit }
        let pool = config.defaultShare.map { QuotaConfig.share($0, of: config.limit) } ?? max(0, config.limit - listed)
        all.append(QuotaAllocation(index: all.count, name: QuotaConfig.defaultAllocation, limit: pool))
        self.all = all
        self.byKey = byKey
    }

    /// What unlisted keys and requests without the key draw from.
    public var pool: QuotaAllocation { all[all.count - 1] }

    /// The allocation of a key's value (`nil`: the request has none).
    public func allocation(forKey key: String?) -> QuotaAllocation {
        guard let key, let index = byKey[key] else { return pool }
        return all[index]
    }
}
