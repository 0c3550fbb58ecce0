import Foundation
import HTTPTypes

/// How long a response stays fresh and how old it already was when it arrived
/// (RFC 9111 §4.2), plus the response directives that limit how it may be reused.
/// Pure: computed from the response head and the times it was requested and received.
public struct ResponseFreshness: Sendable, Equatable {
    /// The freshness lifetime (§4.2.1); zero when the response is stale on arrival.
    public var lifetime: Duration
    /// `corrected_initial_age` (§4.2.3): the age when the response was received.
    public var initialAge: Duration
    /// `no-cache` without field names: every reuse needs validation.
    public var noCache: Bool
    /// Fields named by `no-cache="…"`: never sent from the cache without validation.
    public var noCacheFields: [String]
    /// `must-revalidate`, `proxy-revalidate` or `s-maxage`: never served stale (§5.2.2.2, .8, .10).
    public var mustRevalidate: Bool
    /// `public`, `s-maxage` or `must-revalidate`: reusable for requests with `Authorization` (§3.5).
    public var sharedWithAuthorization: Bool
    public var immutable: Bool
    public var staleWhileRevalidate: Duration?
    public var staleIfError: Duration?
    /// Whether the lifetime came from heuristics rather than the response.
    public var heuristic: Bool

    /// Statuses cacheable by default (RFC 9110 §15.1).
    public static let heuristicallyCacheable: Set<Int> = [200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501]

    /// `targets`: the targeted fields (RFC 9213) this cache obeys before `Cache-Control`.
    public init(status: Int, headerFields fields: HTTPFields, requestTime: Date, responseTime: Date,
                heuristicFraction: Double = 0, heuristicMax: Duration = .seconds(86_400),
                targets: [HTTPField.Name] = []) {
        let governing = ResponseCacheControl(fields, targets: targets)
        let cc = governing.directives
        let date = Self.singleDate(fields, .date) ?? responseTime

        // §4.2.1: s-maxage, then max-age, then Expires − Date, then heuristics. A malformed or
        // conflicting value makes the response stale, as the RFC allows.
        var explicit: Duration?
        var invalid = false
        for directive in [CacheControl.Name.sMaxAge, .maxAge] {
            switch cc.seconds(directive) {
            case .absent: continue
            case .value(let seconds): explicit = .seconds(seconds)
            case .invalid: invalid = true
            }
            break
        }
        if explicit == nil, !invalid, governing.honoursExpires, !fields[values: .expires].isEmpty {
            if let expires = Self.singleDate(fields, .expires) {
                explicit = Self.duration(max(0, expires.timeIntervalSince(date)))
            } else {
                invalid = true  // unparseable (`0`, `-1`) or conflicting Expires: already expired
            }
        }
        var heuristic = false
        if let explicit {
            lifetime = explicit
        } else if invalid {
            lifetime = .zero
        } else if heuristicFraction > 0,
                  Self.heuristicallyCacheable.contains(status) || cc.contains(.public),
                  let lastModified = Self.singleDate(fields, .lastModified), lastModified < date {
            let seconds = date.timeIntervalSince(lastModified) * heuristicFraction
            lifetime = min(Self.duration(seconds), heuristicMax)
            heuristic = true
        } else {
            lifetime = .zero
        }
        self.heuristic = heuristic

        // §4.2.3 age calculation.
        let ageValue: Duration = switch CacheControl.deltaSeconds(Self.firstAge(fields)) {
        case .some(let seconds): .seconds(seconds)
        case .none: .zero
        }
        let apparentAge = Self.duration(max(0, responseTime.timeIntervalSince(date)))
        let responseDelay = Self.duration(max(0, responseTime.timeIntervalSince(requestTime)))
        initialAge = max(apparentAge, ageValue + responseDelay)

        let noCacheFields = cc.fieldNames(.noCache)
        noCache = noCacheFields?.isEmpty == true
        self.noCacheFields = noCacheFields ?? []
        let sMaxAge = cc.seconds(.sMaxAge) != .absent
        mustRevalidate = cc.contains(.mustRevalidate) || cc.contains(.proxyRevalidate) || sMaxAge
        sharedWithAuthorization = cc.contains(.public) || cc.contains(.mustRevalidate) || sMaxAge
        immutable = cc.contains(.immutable)
        staleWhileRevalidate = Self.window(cc.seconds(.staleWhileRevalidate))
        staleIfError = Self.window(cc.seconds(.staleIfError))
    }

    /// `current_age` at `residentTime` after the response was received.
    public func age(residentFor residentTime: Duration) -> Duration {
        initialAge + max(.zero, residentTime)
    }

    /// Whether the response is fresh at `age`.
    public func isFresh(atAge age: Duration) -> Bool {
        lifetime > age
    }

    /// RFC 5861 windows; a malformed one counts as absent (no stale serving on its account).
    private static func window(_ seconds: CacheControl.Seconds) -> Duration? {
        if case .value(let value) = seconds { return .seconds(value) }
        return nil
    }

    /// The field's date when it appears once (or repeats one value) and parses.
    static func singleDate(_ fields: HTTPFields, _ name: HTTPField.Name) -> Date? {
        let values = fields[values: name]
        guard let first = values.first, values.allSatisfy({ $0 == first }) else { return nil }
        return HTTPDate.parse(first.trimmingWhitespace())
    }

    /// The `Age` value to use: the first list element when a sender listed several (`7200, 0`,
    /// or two field lines), less any parameter, as caches in the wild do (http-tests'
    /// `age-parse-*`). What is left must still be plain delta-seconds; a line that starts with
    /// an empty element (`, 7200`) has no first value.
    static func firstAge(_ fields: HTTPFields) -> Substring {
        guard let line = fields[values: .age].first,
              let first = HTTPList(line).first(where: { _ in true }),
              first.text.startIndex == HTTPList.trimmed(Substring(line)).startIndex else { return "" }
        return first.value
    }

    static func duration(_ seconds: TimeInterval) -> Duration {
        .seconds(min(seconds, Double(CacheControl.maxDeltaSeconds)))
    }
}
