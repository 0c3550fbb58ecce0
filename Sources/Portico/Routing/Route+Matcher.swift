import HTTPTypes

extension Route {
    /// How a route matches a request: host, exact path or longest prefix, methods.
    public struct Matcher: Sendable {
        public var path: String?
        public var pathPrefix: String?
        /// Lower-cased; `*.example.com` matches any subdomain.
        public var host: String?
        /// Upper-cased method names; empty allows all.
        public var methods: Set<String>

        public init(path: String? = nil, pathPrefix: String? = nil, host: String? = nil, methods: [String] = []) {
            self.path = path
            self.pathPrefix = pathPrefix
            self.host = host?.lowercased()
            self.methods = Set(methods.map { $0.uppercased() })
        }

        /// More specific matches rank higher: a host, then an exact path, then a longer prefix.
        public struct Rank: Comparable, Sendable {
            var hostSpecific: Bool
            var exactPath: Bool
            var prefixLength: Int
            public static func < (a: Rank, b: Rank) -> Bool {
                (a.hostSpecific ? 1 : 0, a.exactPath ? 1 : 0, a.prefixLength)
                    < (b.hostSpecific ? 1 : 0, b.exactPath ? 1 : 0, b.prefixLength)
            }
        }

        /// The rank when host and path match, ignoring the method.
        func rank(host requestHost: String?, path requestPath: Substring) -> Rank? {
            if let host {
                guard let requestHost, Self.hostMatches(pattern: host, host: requestHost) else { return nil }
            }
            if let path, !requestPath.utf8.elementsEqual(path.utf8) { return nil }
            var prefixLength = 0
            if let pathPrefix {
                guard Self.prefixMatches(prefix: pathPrefix, path: requestPath) else { return nil }
                prefixLength = pathPrefix.utf8.count
            }
            return Rank(hostSpecific: host != nil, exactPath: path != nil, prefixLength: prefixLength)
        }

        func allows(_ method: HTTPRequest.Method) -> Bool {
            methods.isEmpty || methods.contains(method.rawValue)
                || (method == .head && methods.contains("GET"))
        }

        /// A prefix ending in `/` matches as a string; otherwise it matches whole segments
        /// (`/api` matches `/api` and `/api/x`, not `/apix`).
        static func prefixMatches(prefix: String, path: Substring) -> Bool {
            // Bytes, not characters: paths are compared as sent, with no Unicode normalisation.
            guard path.utf8.starts(with: prefix.utf8) else { return false }
            if prefix.utf8.last == UInt8(ascii: "/") { return true }
            let rest = path.utf8.dropFirst(prefix.utf8.count)
            return rest.isEmpty || rest.first == UInt8(ascii: "/")
        }

        static func hostMatches(pattern: String, host: String) -> Bool {
            if pattern.hasPrefix("*.") {
                let suffix = pattern.dropFirst(1)  // ".example.com"
                return host.hasSuffix(suffix) && host.count > suffix.count
            }
            return pattern == host
        }

        /// `Example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
        static func hostname(of host: String) -> String {
            var value = Substring(host)
            if value.hasPrefix("[") {
                if let close = value.firstIndex(of: "]") { value = value[...close] }
            } else if let colon = value.lastIndex(of: ":") {
                value = value[..<colon]
            }
            return value.lowercased()
        }
    }
}
