import HTTPTypes

/// What a request asks of the cache (RFC 9111 §5.2.1), read once per request.
public struct RequestDirectives: Sendable, Equatable {
    /// `no-cache`, or `Pragma: no-cache` when there is no `Cache-Control` (§5.4).
    public var noCache = false
    public var noStore = false
    /// The oldest response the client accepts (age, not staleness).
    public var maxAge: Duration?
    /// How stale a response may be; `max-stale` without a value allows any staleness.
    public var maxStale: Duration?
    /// A response must stay fresh at least this much longer.
    public var minFresh: Duration?
    /// Never contact the upstream: answer from the cache or with 504.
    public var onlyIfCached = false
    /// `Authorization` is present (§3.5).
    public var hasAuthorization = false

    static let pragma = HTTPField.Name("Pragma")!

    public init() {}

    public init(_ fields: HTTPFields) {
        let cacheControl = CacheControl(fields)
        if cacheControl.isEmpty {
            noCache = fields[values: Self.pragma].contains { value in
                HTTPList(value).contains { HTTPSyntax.equalsIgnoringCase($0.text, CacheControl.Name.noCache.rawValue) }
            }
        } else {
            noCache = cacheControl.contains(.noCache)
        }
        noStore = cacheControl.contains(.noStore)
        onlyIfCached = cacheControl.contains(.onlyIfCached)
        // A malformed request limit is read as the strictest value (0): the client gets a
        // validated response rather than an older one than it asked for.
        maxAge = Self.duration(cacheControl.seconds(.maxAge), invalid: .zero)
        maxStale = Self.duration(cacheControl.secondsAllowingBare(.maxStale), invalid: nil)
        minFresh = Self.duration(cacheControl.seconds(.minFresh), invalid: .seconds(CacheControl.maxDeltaSeconds))
        hasAuthorization = fields[.authorization] != nil
    }

    private static func duration(_ seconds: CacheControl.Seconds, invalid: Duration?) -> Duration? {
        switch seconds {
        case .absent: nil
        case .value(let value): .seconds(value)
        case .invalid: invalid
        }
    }
}
