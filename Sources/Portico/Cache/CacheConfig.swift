import HTTPTypes

/// `type: cache` — a shared HTTP cache (RFC 9111) in memory.
public struct CacheConfig: Sendable, Equatable {
    /// All stored responses together (bodies, headers, keys) stay under this many bytes;
    /// the least recently used are evicted first.
    public var maxBytes: Int = 64 << 20
    /// A response whose body is larger passes through without being stored.
    public var maxObjectBytes: Int = 1 << 20
    /// Heuristic freshness for responses with `Last-Modified` and no explicit lifetime:
    /// this fraction of the time since the last modification (RFC 9111 §4.2.2). 0 = off.
    public var heuristicFraction: Double = 0
    /// Upper bound of a heuristic lifetime.
    public var heuristicMax: Duration = .seconds(86_400)
    /// Used when a response has no `stale-while-revalidate` of its own.
    public var staleWhileRevalidate: Duration = .zero
    /// Used when a response has no `stale-if-error` of its own.
    public var staleIfError: Duration = .zero
    /// Deadline of a background refresh (`stale-while-revalidate`).
    public var revalidationTimeout: Duration = .seconds(10)
    /// Keys with a fetch in flight that other requests may wait on, and background refreshes
    /// running at once (each bounded separately).
    public var maxInFlight: Int = 1024
    /// Targeted cache-control fields (RFC 9213) this cache obeys, in order of preference, before
    /// `Cache-Control` and `Expires` — e.g. `CDN-Cache-Control`. Empty: only `Cache-Control`.
    public var targetedCacheControl: [HTTPField.Name] = []
    /// Also send `X-Cache: HIT|MISS|STALE|REVALIDATED|BYPASS` (besides `Cache-Status`).
    public var xCache: Bool = false
    /// `stores.NAME`: a second tier on Redis shared by every replica (`SharedCacheTier`).
    public var store: String?
    /// Responses with larger bodies stay in this replica's memory only.
    public var maxEntryBytes: Int = 1 << 20
    /// How long a replica waits for the one fetching a missing key for the fleet, before it
    /// fetches the key itself.
    public var storeWait: Duration = .seconds(1)

    public init() {}
}
