import Foundation
import HTTPTypes

/// The RFC 9111 rules as pure functions of messages, entries and times: what may be stored,
/// whether a stored response may answer a request, and how a 304 updates it. No I/O, so every
/// rule is unit-tested with plain values.
public struct CachePolicy: Sendable {
    public let config: CacheConfig

    public init(_ config: CacheConfig) {
        self.config = config
    }

    /// Statuses the cache understands well enough to store when the response allows it
    /// (§3: "the response status code is final and understood"). 206 and 304 never: the cache
    /// does not combine partial content, and a 304 only updates a stored response.
    public static let understoodStatuses: Set<Int> = [
        200, 203, 204, 300, 301, 302, 303, 307, 308,
        400, 403, 404, 405, 410, 414, 451, 500, 501, 502, 503, 504,
    ]

    public enum Storability: Sendable, Equatable {
        /// Store, leaving out the fields `private="…"` names (§5.2.2.7).
        case store(excludingFields: [String])
        case no(reason: String)
    }

    /// The directives that govern a response here: the first configured targeted field with a
    /// valid value (RFC 9213), else `Cache-Control`.
    public func directives(of fields: HTTPFields) -> ResponseCacheControl {
        ResponseCacheControl(fields, targets: config.targetedCacheControl)
    }

    /// The freshness of a response received between `requestTime` and `responseTime`.
    public func freshness(status: Int, headerFields: HTTPFields, requestTime: Date, responseTime: Date) -> ResponseFreshness {
        ResponseFreshness(status: status, headerFields: headerFields, requestTime: requestTime, responseTime: responseTime,
                          heuristicFraction: config.heuristicFraction, heuristicMax: config.heuristicMax,
                          targets: config.targetedCacheControl)
    }

    /// §3 for a response to a GET (the caller only asks for GETs).
    public func storability(request: RequestDirectives, response: GatewayResponse, freshness: ResponseFreshness) -> Storability {
        let governing = directives(of: response.headerFields)
        let cc = governing.directives
        let status = response.status.code
        guard Self.understoodStatuses.contains(status) else { return .no(reason: "status") }
        if request.noStore || cc.contains(.noStore) { return .no(reason: "no-store") }
        let privateFields = cc.fieldNames(.private)
        if privateFields?.isEmpty == true { return .no(reason: "private") }
        if request.hasAuthorization && !freshness.sharedWithAuthorization { return .no(reason: "authorization") }
        if VaryKey(response: response.headerFields, request: [:]) == nil { return .no(reason: "vary-star") }
        // The RFC lets shared caches store Set-Cookie, but a session cookie served to another
        // client is a security hole: only responses the origin marks shareable are stored.
        if response.headerFields[.setCookie] != nil && !(cc.contains(.public) || cc.contains(.sMaxAge)) {
            return .no(reason: "set-cookie")
        }
        let explicit = cc.contains(.maxAge) || cc.contains(.sMaxAge)
            || (governing.honoursExpires && response.headerFields[.expires] != nil)
        let heuristic = ResponseFreshness.heuristicallyCacheable.contains(status) || cc.contains(.public)
        guard explicit || heuristic else { return .no(reason: "no-freshness") }
        // A response that is stale at once and cannot be validated could never be reused.
        let validators = response.headerFields[.eTag] != nil || response.headerFields[.lastModified] != nil
        let usable = freshness.lifetime > freshness.initialAge && !freshness.noCache
        let staleUse = !freshness.mustRevalidate && !freshness.noCache
            && ((freshness.staleIfError ?? config.staleIfError) > .zero
                || (freshness.staleWhileRevalidate ?? config.staleWhileRevalidate) > .zero)
        guard usable || validators || staleUse else { return .no(reason: "stale") }
        return .store(excludingFields: privateFields ?? [])
    }

    /// Why a stored response cannot be used as it is.
    public enum ValidationReason: String, Sendable, Equatable {
        /// The stored response is stale (or `no-cache`): `fwd=stale`.
        case stale
        /// The request's directives refuse it: `fwd=request`.
        case request
    }

    public enum Usability: Sendable, Equatable {
        case fresh
        /// Stale, and the request's `max-stale` accepts it.
        case staleAccepted
        /// Stale within `stale-while-revalidate`: serve it and refresh in the background.
        case staleWhileRevalidate
        case validate(ValidationReason)
    }

    /// §4.2, §4.2.4 and §5.2.1: can `entry` answer `request` at `now` without the upstream?
    public func usability(of entry: CacheEntry, for request: RequestDirectives, at now: ContinuousClock.Instant) -> Usability {
        let freshness = entry.freshness
        let age = entry.age(at: now)
        if request.noCache { return .validate(.request) }
        if freshness.noCache { return .validate(.stale) }
        if freshness.isFresh(atAge: age) {
            // An immutable response does not change while fresh: a reload's max-age=0 gains nothing.
            if let maxAge = request.maxAge, age > maxAge, !freshness.immutable { return .validate(.request) }
            if let minFresh = request.minFresh, freshness.lifetime - age < minFresh { return .validate(.request) }
            return .fresh
        }
        if freshness.mustRevalidate { return .validate(.stale) }
        let staleness = age - freshness.lifetime
        if let maxStale = request.maxStale, staleness <= maxStale, request.minFresh == nil,
           request.maxAge.map({ age <= $0 }) ?? true {
            return .staleAccepted
        }
        let window = freshness.staleWhileRevalidate ?? config.staleWhileRevalidate
        if staleness <= window, window > .zero, request.maxAge == nil, request.minFresh == nil {
            return .staleWhileRevalidate
        }
        return .validate(.stale)
    }

    /// RFC 5861 §4 within the limits of RFC 9111 §4.2.4: may `entry` answer when the upstream
    /// failed (an error, or a 500, 502, 503 or 504)?
    public func canServeStaleOnError(_ entry: CacheEntry, for request: RequestDirectives, at now: ContinuousClock.Instant) -> Bool {
        let freshness = entry.freshness
        if freshness.mustRevalidate || freshness.noCache || request.noCache { return false }
        let staleness = entry.age(at: now) - freshness.lifetime
        let window = freshness.staleIfError ?? config.staleIfError
        return staleness <= window && (window > .zero || staleness < .zero)
    }

    /// Statuses that count as an upstream error for `stale-if-error`.
    public static func isServerError(_ status: HTTPResponse.Status) -> Bool {
        [500, 502, 503, 504].contains(status.code)
    }

    /// Fields a 304 must not change in a stored response (§3.2).
    static let notUpdatedBy304: Set<String> = ["content-length", "content-encoding", "transfer-encoding", "content-range"]

    /// §3.2 and §4.3.4: the stored response updated with a 304's fields. `nil` when the 304
    /// names a different strong validator than the stored one (it describes another response).
    public func freshen(_ entry: CacheEntry, with notModified: GatewayResponse, requestTime: Date, responseTime: Date,
                        now: ContinuousClock.Instant, excludingFields: [String]) -> CacheEntry? {
        if let newTag = notModified.headerFields[.eTag], let stored = entry.etag,
           !ConditionalRequest.weakMatch(newTag, stored) {
            return nil
        }
        var fields = entry.headerFields
        var replaced = Set<HTTPField.Name>()
        for field in notModified.headerFields {
            let lower = field.name.canonicalName
            if Self.notUpdatedBy304.contains(lower) || excludingFields.contains(lower) { continue }
            if replaced.insert(field.name).inserted { fields[values: field.name] = [] }
            fields.append(field)
        }
        // A 304 without Date is dated on receipt, as a stored response without one is: the stored
        // Date would otherwise count the time since the first fetch as age.
        if notModified.headerFields[.date] == nil { fields[.date] = HTTPDate.format(responseTime) }
        var updated = entry
        updated.headerFields = fields
        updated.freshness = freshness(status: entry.status.code, headerFields: fields, requestTime: requestTime,
                                      responseTime: responseTime)
        updated.receivedAt = now
        return updated
    }
}
