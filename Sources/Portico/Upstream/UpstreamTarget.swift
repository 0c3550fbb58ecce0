import Foundation

/// Where a request goes: the upstream's origin and base path joined with the request's raw target.
///
/// Works on strings only, so the path and query bytes are never decoded or re-encoded:
/// base `/api` + `/orders?x=1` → `/api/orders?x=1`; base `/api/` + `/orders` → `/api/orders`.
public struct UpstreamTarget: Sendable, Equatable {
    /// `scheme://authority` as configured (no trailing slash).
    public var origin: String
    /// `host[:port]` as configured: the `Host` the upstream expects.
    public var authority: String
    /// The base path without a trailing slash (`""` for none).
    public var basePath: String

    public init(baseURL: URL) {
        self.init(baseURL: baseURL.absoluteString)
    }

    public init(baseURL string: String) {
        var rest = Substring(string)
        if let hash = rest.firstIndex(of: "#") { rest = rest[..<hash] }
        if let q = rest.firstIndex(of: "?") { rest = rest[..<q] }
        var scheme = Substring("http")
        if let range = rest.range(of: "://") {
            scheme = rest[..<range.lowerBound]
            rest = rest[range.upperBound...]
        }
        let slash = rest.firstIndex(of: "/") ?? rest.endIndex
        var authority = rest[..<slash]
        if let at = authority.lastIndex(of: "@") { authority = authority[authority.index(after: at)...] }
        var path = rest[slash...]
        while path.hasSuffix("/") { path = path.dropLast() }
        self.origin = "\(scheme.lowercased())://\(authority)"
        self.authority = String(authority)
        self.basePath = String(path)
    }

    /// The path and query to request: the base path joined with the raw target.
    public func pathAndQuery(for target: String) -> String {
        if target.isEmpty { return basePath.isEmpty ? "/" : basePath }
        if target.hasPrefix("/") { return basePath + target }
        if target.hasPrefix("?") { return (basePath.isEmpty ? "/" : basePath) + target }
        return basePath + "/" + target
    }

    /// The absolute URL string for a raw target.
    public func urlString(for target: String) -> String {
        origin + pathAndQuery(for: target)
    }
}
