import HTTPTypes

/// The secondary cache key (RFC 9111 §4.1): the request's values of the fields a response's
/// `Vary` names, normalised so that semantically equal requests match.
public struct VaryKey: Sendable, Equatable {
    /// Lower-cased field names, sorted, without duplicates.
    public var names: [String]
    /// The normalised request value per name (`nil` when the request lacks the field).
    public var values: [String?]

    /// Fields whose values are case-insensitive tokens, so case can be normalised away.
    static let caseInsensitive: Set<String> = ["accept-encoding", "accept-charset", "accept-language", "accept"]

    /// The key for `request` under `response`'s `Vary`; `nil` for `Vary: *`, which no later
    /// request matches.
    public init?(response: HTTPFields, request: HTTPFields) {
        var names = Set<String>()
        for line in response[values: .vary] {
            for item in HTTPList(line) {
                let name = item.text.lowercased()
                if name == "*" { return nil }
                names.insert(name)
            }
        }
        self.names = names.sorted()
        self.values = self.names.map { Self.normalisedValue(of: $0, in: request) }
    }

    /// A key as stored (the fleet tier's records).
    init(names: [String], values: [String?]) {
        self.names = names
        self.values = values
    }

    /// Whether `request` carries the same values for this key's names.
    public func matches(_ request: HTTPFields) -> Bool {
        for (name, value) in zip(names, values) where Self.normalisedValue(of: name, in: request) != value {
            return false
        }
        return true
    }

    /// All lines joined, list members trimmed and empty members dropped (`gzip,  br` equals
    /// `gzip, br` equals two lines `gzip` and `br`).
    static func normalisedValue(of name: String, in fields: HTTPFields) -> String? {
        guard let fieldName = HTTPField.Name(name) else { return nil }
        let lines = fields[values: fieldName]
        guard !lines.isEmpty else { return nil }
        // One string, built in place: a hit computes this for every name its entry varies on.
        var joined = ""
        joined.reserveCapacity(lines.reduce(0) { $0 + $1.utf8.count })
        for line in lines {
            for member in HTTPList(line) {
                if !joined.isEmpty { joined += ", " }
                joined += member.text
            }
        }
        return caseInsensitive.contains(name) ? joined.lowercased() : joined
    }
}
