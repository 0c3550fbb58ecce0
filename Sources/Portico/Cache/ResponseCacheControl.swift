import HTTPTypes
import RawStructuredFieldValues

/// Targeted cache control (RFC 9213): response fields such as `CDN-Cache-Control` that carry
/// cache directives for one class of caches. A cache configured with a target list obeys the
/// first listed field that has a valid, non-empty value, and then ignores `Cache-Control` and
/// `Expires` in that response; with none, it falls back to them. Targeted fields are passed on
/// unchanged either way: caches further down may be their targets too.
public struct ResponseCacheControl: Sendable, Equatable {
    /// The directives that govern the response.
    public var directives: CacheControl
    /// The field they came from; `nil` for `Cache-Control`.
    public var targetedField: HTTPField.Name?

    /// `Expires` counts only when `Cache-Control` governs (RFC 9213 §2.2).
    public var honoursExpires: Bool { targetedField == nil }

    /// What a cache with the target list `targets` obeys in `fields`.
    public init(_ fields: HTTPFields, targets: [HTTPField.Name] = []) {
        for name in targets {
            if let directives = Self.targeted(fields[values: name]) {
                self.directives = directives
                targetedField = name
                return
            }
        }
        directives = CacheControl(fields)
        targetedField = nil
    }

    /// Directives whose values are delta-seconds, Integers in a targeted field.
    private static let integerDirectives: Set<String> = Set(
        [CacheControl.Name.maxAge, .sMaxAge, .staleWhileRevalidate, .staleIfError].map(\.rawValue))

    /// A targeted field's lines (RFC 9213 §2.1): one Structured Fields Dictionary (the lines
    /// joined with commas), whose members map onto cache directives. `nil` when the field is
    /// absent, empty or does not parse — the cache then behaves as if it were not there.
    static func targeted(_ lines: [String]) -> CacheControl? {
        guard !lines.isEmpty else { return nil }
        let joined = lines.joined(separator: ", ")
        var parser = StructuredFieldValueParser(Array(joined.utf8))
        guard let dictionary = try? parser.parseDictionaryFieldValue(), dictionary.count > 0 else { return nil }
        var directives: [CacheControl.Directive] = []
        for (name, member) in dictionary {
            // Parameters on directives are ignored (§2.1); an inner list is no directive's type.
            guard case .item(let item) = member else {
                directives.append(.init(name: name, argument: CacheControl.malformedArgument))
                continue
            }
            switch item.rfc9651BareItem {
            case .bool(true):
                // Delta-seconds directives need their Integer; bare, they are malformed.
                directives.append(.init(name: name, argument: integerDirectives.contains(name) ? CacheControl.malformedArgument : nil))
            case .bool(false):
                continue  // `no-store=?0` says "not no-store"
            case .integer(let value) where value >= 0:
                directives.append(.init(name: name, argument: String(value)))
            case .string(let value) where !integerDirectives.contains(name):
                directives.append(.init(name: name, argument: value))  // `private="set-cookie"`
            case .token(let value) where !integerDirectives.contains(name):
                directives.append(.init(name: name, argument: value))
            default:
                // A negative or decimal max-age, a quoted number, …: not consumed (§2.1), and
                // read as malformed, which makes a response stale rather than fresh for longer.
                directives.append(.init(name: name, argument: CacheControl.malformedArgument))
            }
        }
        return CacheControl(directives: directives)
    }
}
