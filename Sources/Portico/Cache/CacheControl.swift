import HTTPTypes

/// The directives of every `Cache-Control` field line of a message (RFC 9111 §5.2), parsed
/// once. Directive names are case-insensitive; arguments may be tokens or quoted strings
/// (recipients accept both forms, §5.2); unknown directives are kept and ignored by callers.
public struct CacheControl: Sendable, Equatable {
    public struct Directive: Sendable, Equatable {
        /// Lower-cased.
        public var name: String
        /// The argument with quotes and escapes removed; `nil` when there is no `=`.
        public var argument: String?
    }

    /// What a delta-seconds directive (`max-age=60`) says.
    public enum Seconds: Sendable, Equatable {
        case absent
        case value(Int)
        /// Malformed (`max-age=soon`, `max-age`) or given twice with different values:
        /// RFC 9111 §4.2.1 lets a cache treat such a response as stale, which is the safe side.
        case invalid
    }

    /// The largest delta-seconds a cache needs to represent (§1.2.2): larger values saturate.
    public static let maxDeltaSeconds = 2_147_483_648

    /// An argument no delta-seconds reading accepts: what a wrongly typed member of a targeted
    /// field becomes, so `seconds` reports it `invalid` like a malformed `Cache-Control` value.
    static let malformedArgument = ""

    public private(set) var directives: [Directive] = []

    public init(directives: [Directive] = []) {
        self.directives = directives
    }

    /// All `Cache-Control` lines of `fields`, in order.
    public init(_ fields: HTTPFields) {
        for value in fields[values: .cacheControl] {
            directives += Self.parse(value)
        }
    }

    public init(parsing value: String) {
        directives = Self.parse(value)
    }

    public var isEmpty: Bool { directives.isEmpty }

    public func contains(_ name: Name) -> Bool {
        directives.contains { $0.name == name.rawValue }
    }

    /// A delta-seconds argument. A directive repeated with the same value is fine; conflicting
    /// repeats are `invalid`.
    public func seconds(_ name: Name) -> Seconds {
        var result = Seconds.absent
        for directive in directives where directive.name == name.rawValue {
            guard let argument = directive.argument, let value = Self.deltaSeconds(argument) else { return .invalid }
            if case .value(let earlier) = result, earlier != value { return .invalid }
            result = .value(value)
        }
        return result
    }

    /// `max-stale` may come without an argument (any staleness): `.value(maxDeltaSeconds)` then.
    public func secondsAllowingBare(_ name: Name) -> Seconds {
        if directives.contains(where: { $0.name == name.rawValue && $0.argument == nil }) {
            return .value(Self.maxDeltaSeconds)
        }
        return seconds(name)
    }

    /// `no-cache` and `private` as a field-name list: `nil` when absent, empty when
    /// unqualified (applies to the whole response), the lower-cased names otherwise.
    public func fieldNames(_ name: Name) -> [String]? {
        var found = false
        var names: [String] = []
        for directive in directives where directive.name == name.rawValue {
            found = true
            guard let argument = directive.argument else { return [] }
            let listed = HTTPList(argument).map { $0.text.lowercased() }
            // `no-cache=""` names nothing; reading it as unqualified is the stricter choice.
            if listed.isEmpty { return [] }
            names += listed
        }
        return found ? names : nil
    }

    /// `1*DIGIT`; anything else is nil. Values past `maxDeltaSeconds` saturate (§1.2.2).
    static func deltaSeconds(_ text: some StringProtocol) -> Int? {
        guard !text.isEmpty else { return nil }
        var value = 0
        for byte in text.utf8 {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
            if value < maxDeltaSeconds {
                value = min(maxDeltaSeconds, value * 10 + Int(byte - UInt8(ascii: "0")))
            }
        }
        return value
    }

    /// `token [ "=" ( token / quoted-string ) ]` per list element (`HTTPList`). Garbage after a
    /// directive, up to the next comma outside quotes, is skipped, so one bad directive does not
    /// hide the ones after it.
    static func parse(_ value: String) -> [Directive] {
        var result: [Directive] = []
        for element in HTTPList(value) {
            let (name, rest) = nameAndRest(element)
            guard !name.isEmpty else { continue }
            var argument: String?
            if rest.utf8.first == UInt8(ascii: "=") {
                let text = HTTPList.trimmed(rest[rest.utf8.index(after: rest.startIndex)...])
                argument = text.utf8.first == UInt8(ascii: "\"")
                    ? HTTPList.unquoted(text)
                    : String(text[..<(text.utf8.firstIndex(where: OWS.contains) ?? text.endIndex)])
            }
            result.append(Directive(name: name.lowercased(), argument: argument))
        }
        return result
    }

    /// A directive's name (up to `=` or OWS) and what follows it, OWS skipped.
    static func nameAndRest(_ element: HTTPList.Element) -> (name: Substring, rest: Substring) {
        let text = element.text
        let nameEnd = text.utf8.firstIndex { $0 == UInt8(ascii: "=") || OWS.contains($0) } ?? text.endIndex
        return (text[..<nameEnd], HTTPList.trimmed(text[nameEnd...]))
    }

    /// Whether one `Cache-Control` line names `directive`, without parsing arguments or
    /// allocating.
    static func lists(_ directive: Name, in value: String) -> Bool {
        HTTPList(value).contains { HTTPSyntax.equalsIgnoringCase(nameAndRest($0).name, directive.rawValue) }
    }
}

extension CacheControl {
    /// A directive name, lower-case. Every directive Portico reads or writes is named here, once
    /// (RFC 9111 §5.2, RFC 5861 for the stale-* extensions, RFC 8246 for `immutable`); a string
    /// literal works too, for names nobody needs twice.
    public struct Name: RawRepresentable, Hashable, Sendable, ExpressibleByStringLiteral, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public init(stringLiteral value: String) { rawValue = value }
        public var description: String { rawValue }

        // Both directions (§5.2.1, §5.2.2).
        public static let maxAge: Name = "max-age"
        public static let noCache: Name = "no-cache"
        public static let noStore: Name = "no-store"
        public static let noTransform: Name = "no-transform"
        // Requests (§5.2.1).
        public static let maxStale: Name = "max-stale"
        public static let minFresh: Name = "min-fresh"
        public static let onlyIfCached: Name = "only-if-cached"
        // Responses (§5.2.2).
        public static let mustRevalidate: Name = "must-revalidate"
        public static let proxyRevalidate: Name = "proxy-revalidate"
        public static let `private`: Name = "private"
        public static let `public`: Name = "public"
        public static let sMaxAge: Name = "s-maxage"
        public static let immutable: Name = "immutable"
        public static let staleWhileRevalidate: Name = "stale-while-revalidate"
        public static let staleIfError: Name = "stale-if-error"
    }
}
