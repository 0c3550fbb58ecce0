import NIOCore
import NIOSSL

/// Where a Redis server is and how to talk to it. `description` never shows the password.
public struct RedisConfiguration: Sendable, CustomStringConvertible {
    public var host: String
    public var port: Int = 6379
    /// `SELECT`ed after connecting when not 0.
    public var database: Int = 0
    /// An ACL user (Redis 6+); `nil`: the `default` user.
    public var username: String?
    public var password: String?
    /// Set for `rediss://`: TLS with these settings.
    public var tls: TLSConfiguration?
    /// The name checked in the server's certificate and sent as SNI; defaults to `host` when it
    /// is a DNS name.
    public var tlsServerName: String?
    /// Connections kept open; commands are pipelined on them, so a few serve many callers.
    public var connections: Int = 4
    /// Default bound on a command, waiting for a connection included.
    public var commandTimeout: TimeAmount = .seconds(1)
    /// Bound on opening a connection (TCP, TLS, `HELLO`/`AUTH`, `SELECT`).
    public var connectTimeout: TimeAmount = .seconds(2)
    /// Reconnection waits a random time up to `min(backoffCap, backoffBase·2ⁿ)` after the nth
    /// failure in a row (full jitter); commands meanwhile fail at once with `.unavailable`.
    public var backoffBase: TimeAmount = .milliseconds(25)
    public var backoffCap: TimeAmount = .seconds(1)
    /// Commands waiting for a reply on one connection at most; past it, `.unavailable`.
    public var maxPendingPerConnection: Int = 4096
    /// `CLIENT SETNAME` (sent with `HELLO`).
    public var clientName: String?

    public init(host: String, port: Int = 6379) {
        self.host = host
        self.port = port
    }

    public struct URLError: Error, Sendable, Equatable, CustomStringConvertible {
        public var description: String
    }

    /// `redis://[user[:password]@]host[:port][/db]` (`:password@` without a user) or `rediss://…` (TLS with the system's
    /// trust roots unless `tls` is replaced). Percent-escapes in the user and password are decoded.
    public init(url: String) throws(URLError) {
        let scheme: String
        var rest: Substring
        if url.hasPrefix("redis://") {
            scheme = "redis"
            rest = url.dropFirst("redis://".count)
        } else if url.hasPrefix("rediss://") {
            scheme = "rediss"
            rest = url.dropFirst("rediss://".count)
        } else {
            throw URLError(description: "must start with redis:// or rediss://")
        }
        if let query = rest.firstIndex(where: { $0 == "?" || $0 == "#" }) {
            guard rest[query...].count <= 1 else { throw URLError(description: "query and fragment are not supported") }
            rest = rest[..<query]
        }
        var path = ""
        if let slash = rest.firstIndex(of: "/") {
            path = String(rest[rest.index(after: slash)...])
            rest = rest[..<slash]
        }
        var user: String?, password: String?
        if let at = rest.lastIndex(of: "@") {
            let userinfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            if let colon = userinfo.firstIndex(of: ":") {
                user = try Self.percentDecoded(userinfo[..<colon], "user name")
                password = try Self.percentDecoded(userinfo[userinfo.index(after: colon)...], "password")
            } else {
                // As the URI scheme's registration says: `user@` names a user (a password alone is `:secret@`).
                user = try Self.percentDecoded(userinfo, "user name")
            }
            if user?.isEmpty == true { user = nil }
        }
        var host = String(rest)
        var port = 6379
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { throw URLError(description: "unterminated IPv6 address") }
            let after = host[host.index(after: close)...]
            if after.hasPrefix(":") {
                guard let number = Int(after.dropFirst()), (1...65535).contains(number) else {
                    throw URLError(description: "invalid port")
                }
                port = number
            } else if !after.isEmpty {
                throw URLError(description: "invalid host")
            }
            host = String(host[host.index(after: host.startIndex)..<close])
        } else if let colon = host.lastIndex(of: ":") {
            guard let number = Int(host[host.index(after: colon)...]), (1...65535).contains(number) else {
                throw URLError(description: "invalid port")
            }
            port = number
            host = String(host[..<colon])
        }
        guard !host.isEmpty else { throw URLError(description: "missing host") }
        guard host.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else { throw URLError(description: "invalid host") }
        var database = 0
        if !path.isEmpty {
            guard let number = Int(path), (0...1_000_000).contains(number) else {
                throw URLError(description: "the path must be a database number such as /0")
            }
            database = number
        }
        self.init(host: host, port: port)
        self.database = database
        self.username = user
        self.password = password
        if scheme == "rediss" { tls = TLSConfiguration.makeClientConfiguration() }
    }

    private static func percentDecoded(_ text: Substring, _ what: String) throws(URLError) -> String {
        var bytes: [UInt8] = []
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard let high = iterator.next().flatMap(Self.hexValue), let low = iterator.next().flatMap(Self.hexValue) else {
                throw URLError(description: "invalid percent-escape in the \(what)")
            }
            bytes.append(high << 4 | low)
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// `redis://user@host:port/db` (or `rediss://`), password left out.
    public var description: String {
        let scheme = tls == nil ? "redis" : "rediss"
        let user = username.map { "\($0)@" } ?? ""
        let shownHost = host.contains(":") ? "[\(host)]" : host
        return "\(scheme)://\(user)\(shownHost):\(port)/\(database)"
    }
}
