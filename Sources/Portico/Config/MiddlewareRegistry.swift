/// The middleware types a loader knows, by `type:` word.
struct MiddlewareRegistry: Sendable {
    /// Every type Portico ships. Adding one is a `MiddlewareKind` in its folder and an entry here.
    static let standard = MiddlewareRegistry([
        AccessLogKind(), AuthKind(), CacheKind(), CompressKind(), HeadersKind(), QuotaKind(), RateLimitKind(), RetryKind(),
    ])

    private let kinds: [any MiddlewareKind]

    init(_ kinds: [any MiddlewareKind]) {
        self.kinds = kinds
    }

    /// This registry and one more type (tests, embedders); a kind with a word already known
    /// replaces it.
    func adding(_ kind: any MiddlewareKind) -> MiddlewareRegistry {
        MiddlewareRegistry(kinds.filter { $0.typeName != kind.typeName } + [kind])
    }

    func kind(named typeName: String) -> (any MiddlewareKind)? {
        kinds.first { $0.typeName == typeName }
    }

    /// The `type:` words, sorted: what the error for an unknown type lists.
    var typeNames: [String] { kinds.map(\.typeName).sorted() }
}
