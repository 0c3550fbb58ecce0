import Foundation
import HTTPTypes

/// What a purge (`POST /cache/purge`) or an invalidation drops: one URL, every URL under a path
/// prefix, or every response tagged by its upstream (`Surrogate-Key`, `Cache-Tag`).
public enum CachePurgeTarget: Sendable, Equatable {
    /// One primary key (`CacheMiddleware.key`: authority and target).
    case key(String)
    /// Targets starting with `path`, on `authority` or on every authority.
    case prefix(String, authority: String?)
    case tag(String)

    /// The tags an upstream gave a response: `Surrogate-Key` (space-separated, Fastly's) and
    /// `Cache-Tag` (comma-separated, Cloudflare's and Akamai's). Bounded: at most `maxTags`
    /// tags of at most `maxTagBytes` each are kept, so a response cannot make an index huge.
    static func tags(of fields: HTTPFields) -> [String] {
        var tags: [String] = []
        func add(_ tag: Substring) {
            let text = tag.trimmingCharacters(in: .whitespaces)
            guard !text.isEmpty, text.utf8.count <= maxTagBytes, tags.count < maxTags, !tags.contains(text) else { return }
            tags.append(text)
        }
        for line in fields[values: surrogateKey] { line.split(separator: " ").forEach(add) }
        for line in fields[values: cacheTag] { line.split(separator: ",").forEach(add) }
        return tags
    }

    static let maxTags = 32
    static let maxTagBytes = 256
    static let surrogateKey = HTTPField.Name("Surrogate-Key")!
    static let cacheTag = HTTPField.Name("Cache-Tag")!

    /// Whether a stored entry under `key` with `fields` is one this purge drops.
    func matches(key: String, fields: HTTPFields) -> Bool {
        switch self {
        case .key(let purged):
            return key == purged
        case .prefix(let path, let authority):
            guard let separator = key.utf8.firstIndex(of: 0) else { return false }
            let target = key[key.index(after: separator)...]
            if let authority, key[..<separator] != authority.lowercased() { return false }
            return target.hasPrefix(path)
        case .tag(let tag):
            return Self.tags(of: fields).contains(tag)
        }
    }

    /// The purge a `POST /cache/purge` body asks for: exactly one of `url` (absolute, its
    /// authority as clients send it in `Host`), `prefix` (a path, with an optional `host`) or
    /// `tag`; `scope` `local` or `fleet`.
    struct Request: Decodable {
        var url: String?
        var prefix: String?
        var host: String?
        var tag: String?
        var scope: Scope?
        /// One cache middleware by name (default: every one).
        var cache: String?
    }


    public enum Scope: String, Sendable, Decodable {
        /// This replica's memory tier only.
        case local
        /// The store and every replica's memory tier (the default when the cache has a store).
        case fleet
    }

    /// The closed set of reasons a purge request is refused (400), each with its message.
    enum RequestError: Error, Equatable, CustomStringConvertible {
        case notJSON
        case noTarget
        case severalTargets
        case badURL(String)
        case badPrefix
        case hostWithoutPrefix
        case emptyTag

        var description: String {
            switch self {
            case .notJSON: "the body must be a JSON object such as {\"url\": \"http://api.example/v1/items\"}"
            case .noTarget: "name what to purge: one of \"url\", \"prefix\" or \"tag\""
            case .severalTargets: "name one of \"url\", \"prefix\" or \"tag\", not several"
            case .badURL(let url): "\"url\" must be an absolute http(s) URL with a host, got \"\(url)\""
            case .badPrefix: "\"prefix\" must be a path starting with /"
            case .hostWithoutPrefix: "\"host\" narrows a \"prefix\" purge; for one URL give \"url\""
            case .emptyTag: "\"tag\" must not be empty"
            }
        }
    }

    /// A purge body's target, scope (`nil`: the cache's default) and cache (`nil`: every one).
    static func parse(_ body: [UInt8]) throws(RequestError) -> (CachePurgeTarget, scope: Scope?, cache: String?) {
        guard let request = try? JSONDecoder().decode(Request.self, from: Data(body)) else { throw .notJSON }
        let named = [request.url, request.prefix, request.tag].compactMap { $0 }
        guard !named.isEmpty else { throw .noTarget }
        guard named.count == 1 else { throw .severalTargets }
        if request.host != nil, request.prefix == nil { throw .hostWithoutPrefix }
        if let url = request.url {
            guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
                  scheme == "http" || scheme == "https", let host = components.percentEncodedHost, !host.isEmpty else {
                throw .badURL(url)
            }
            let authority = components.port.map { "\(host):\($0)" } ?? host
            var target = components.percentEncodedPath.isEmpty ? "/" : components.percentEncodedPath
            if let query = components.percentEncodedQuery { target += "?" + query }
            return (.key(CacheMiddleware.key(authority: authority, target: target)), request.scope, request.cache)
        }
        if let prefix = request.prefix {
            guard prefix.hasPrefix("/") else { throw .badPrefix }
            return (.prefix(prefix, authority: request.host?.lowercased()), request.scope, request.cache)
        }
        let tag = (request.tag ?? "").trimmingCharacters(in: .whitespaces)
        guard !tag.isEmpty else { throw .emptyTag }
        return (.tag(tag), request.scope, request.cache)
    }
}
