import HTTPTypes

/// How the cache handled one request: the `Cache-Status` member (RFC 9211) it adds, the
/// `X-Cache` word, and the access log's `cache` value.
public struct CacheStatus: Sendable, Equatable {
    /// RFC 9211 §2.2 `fwd` reasons used here.
    public enum Forward: String, Sendable {
        /// A method the cache does not answer (POST, PUT, …), or one it never stores.
        case method
        /// The request bypassed the cache (`Range`).
        case bypass
        /// Nothing stored under the URI.
        case uriMiss = "uri-miss"
        /// Something stored under the URI, but for other `Vary` values (or refused for `Authorization`).
        case varyMiss = "vary-miss"
        /// The stored response was stale (or `no-cache`) and was validated.
        case stale
        /// The request's directives (`no-cache`, `max-age`, `min-fresh`) refused the stored response.
        case request
    }

    /// The short word for the access log and `X-Cache`.
    public enum Outcome: String, Sendable {
        case hit
        /// Served stale: `stale-while-revalidate`, `stale-if-error` or the client's `max-stale`.
        case stale
        case miss
        /// A stored response validated with a 304.
        case revalidated
        /// Waited on another request's fetch and shared its response.
        case collapsed
        /// Not handled by the cache (unsafe methods, `Range`).
        case bypass
        /// `only-if-cached` and nothing usable stored: 504 without asking the upstream.
        case onlyIfCached = "only-if-cached"
    }

    public static let cacheName = "portico"
    public static let cacheStatusName = HTTPField.Name("Cache-Status")!
    public static let xCacheName = HTTPField.Name("X-Cache")!

    public var outcome: Outcome
    public var forward: Forward?
    public var forwardStatus: Int?
    /// Seconds of freshness left (negative: stale by that much).
    public var ttl: Int?
    public var stored = false
    public var collapsed = false
    /// A token for what the parameters cannot say (`stale-while-revalidate`, `stale-if-error`, …).
    public var detail: String?

    public init(_ outcome: Outcome, forward: Forward? = nil, forwardStatus: Int? = nil, ttl: Int? = nil,
                stored: Bool = false, collapsed: Bool = false, detail: String? = nil) {
        self.outcome = outcome
        self.forward = forward
        self.forwardStatus = forwardStatus
        self.ttl = ttl
        self.stored = stored
        self.collapsed = collapsed
        self.detail = detail
    }

    /// `portico; hit; ttl=42`, `portico; fwd=uri-miss; fwd-status=200; stored`, …
    public var headerValue: String {
        var value = ""
        value.reserveCapacity(64)
        value += Self.cacheName
        if forward == nil, outcome == .hit || outcome == .stale { value += "; hit" }
        // Appended piece by piece: an interpolation builds a string of its own first.
        if let forward { value += "; fwd="; value += forward.rawValue }
        if let forwardStatus { value += "; fwd-status="; value += String(forwardStatus) }
        if let ttl { value += "; ttl="; value += String(ttl) }
        if stored { value += "; stored" }
        if collapsed { value += "; collapsed" }
        if let detail { value += "; detail=\(detail)" }
        return value
    }

    public var xCacheValue: String {
        switch outcome {
        case .hit, .collapsed: "HIT"
        case .stale: "STALE"
        case .miss, .onlyIfCached: "MISS"
        case .revalidated: "REVALIDATED"
        case .bypass: "BYPASS"
        }
    }

    /// Appends this cache's member (RFC 9211 §2: the cache closest to the client comes last)
    /// and, when asked, sets `X-Cache`.
    func apply(to fields: inout HTTPFields, xCache: Bool) {
        fields.append(HTTPField(name: Self.cacheStatusName, value: headerValue))
        if xCache { fields[Self.xCacheName] = xCacheValue }
    }
}
