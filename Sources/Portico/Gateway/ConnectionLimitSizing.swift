import MicroHTTPD

/// How many client connections the listener takes when `listen.connection_limit` is not set:
/// as many as the process's descriptor limit allows, up to 10 000.
///
/// The listener needs `ServerConfiguration.descriptorsNeeded` descriptors (two per client
/// connection and a reserve): the sum it raises its soft limit to, and warns about when the hard
/// limit is short. A default sized here never makes it warn (unless the hard limit is under
/// `2 × minimumDefault + 1024`); an explicit setting is taken as written, warning and all.
public enum ConnectionLimitSizing {
    /// The default where descriptors are plentiful (or unlimited).
    public static let defaultLimit = 10_000
    /// The default is never sized below this.
    public static let minimumDefault = 64
    /// Descriptors kept for everything but client connections.
    public static let reserve = ServerConfiguration.descriptorReserve

    /// The connection limit for `configured` (`listen.connection_limit`, `nil` when not set)
    /// under the hard descriptor limit `descriptorLimit` (`nil` when unknown or unlimited).
    public static func connectionLimit(configured: Int?, descriptorLimit: UInt64?) -> Int {
        if let configured { return configured }
        guard let descriptorLimit, descriptorLimit > UInt64(reserve) else {
            return descriptorLimit == nil ? defaultLimit : minimumDefault
        }
        let fitting = (descriptorLimit - UInt64(reserve)) / 2
        return max(minimumDefault, Int(clamping: min(fitting, UInt64(defaultLimit))))
    }

    /// Descriptors `connectionLimit` connections need.
    public static func descriptorsNeeded(connectionLimit: Int) -> Int {
        ServerConfiguration.descriptorsNeeded(connectionLimit: connectionLimit)
    }

    /// Descriptors one upgraded (WebSocket) session holds: the client connection's two, the
    /// relay's own duplicate of the client's socket and the upstream connection; on a TLS
    /// listener also libmicrohttpd's socketpair and the server's duplicate of its end.
    public static func descriptorsPerSession(tls: Bool) -> Int { tls ? 7 : 4 }

    /// The cap on sessions when `listen.max_websockets` is not set: as many as the hard
    /// descriptor limit holds beside the reserve (sessions alone never run the process out of
    /// descriptors); 0 (no cap) when the limit is unknown or unlimited.
    public static func websocketLimit(descriptorLimit: UInt64?, tls: Bool) -> Int {
        guard let descriptorLimit, descriptorLimit != .max else { return 0 }
        guard descriptorLimit > UInt64(reserve) else { return minimumDefault }
        let fitting = (descriptorLimit - UInt64(reserve)) / UInt64(descriptorsPerSession(tls: tls))
        return max(minimumDefault, Int(clamping: fitting))
    }
}
