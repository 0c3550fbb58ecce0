/// A content type, or a family of them, that `compress` may encode: `application/json`,
/// `text/*` (any subtype), `*/*+json` (any `+json` structured-syntax suffix, RFC 6838 §4.2.8),
/// `*/*` (everything). Parameters of the response's type (`; charset=utf-8`) are ignored.
public struct MediaTypePattern: Sendable, Equatable, CustomStringConvertible {
    /// Lower-cased type, or `*`.
    public let type: String
    /// Lower-cased subtype, `*`, or `*+suffix`.
    public let subtype: String

    /// `nil` unless `text` is `type/subtype` with tokens, `*`, or a `*+suffix` subtype.
    /// A concrete subtype under a `*` type (`*/json`) is refused: no one means it.
    public init?(_ text: String) {
        let parts = text.trimmingWhitespace().lowercased().split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2 else { return nil }
        let type = String(parts[0]), subtype = String(parts[1])
        guard type == "*" || HTTPSyntax.isToken(type) else { return nil }
        if subtype == "*" {
            // `type/*` and `*/*`
        } else if subtype.hasPrefix("*+") {
            guard HTTPSyntax.isToken(String(subtype.dropFirst(2))) else { return nil }
        } else {
            guard type != "*", HTTPSyntax.isToken(subtype), !subtype.contains("*") else { return nil }
        }
        self.type = type
        self.subtype = subtype
    }

    public var description: String { "\(type)/\(subtype)" }

    /// Whether a `Content-Type` field value falls under this pattern.
    public func matches(contentType: String) -> Bool {
        guard let (type, subtype) = Self.essence(of: contentType) else { return false }
        guard self.type == "*" || self.type == type else { return false }
        if self.subtype == "*" { return true }
        if self.subtype.hasPrefix("*+") { return subtype.hasSuffix(self.subtype.dropFirst()) }
        return self.subtype == subtype
    }

    /// The lower-cased `type` and `subtype` of a media type, parameters dropped.
    static func essence(of contentType: String) -> (type: String, subtype: String)? {
        let mediaType = contentType.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false)[0]
        let parts = mediaType.trimmingWhitespace().lowercased().split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else { return nil }
        return (String(parts[0]), String(parts[1]))
    }
}
