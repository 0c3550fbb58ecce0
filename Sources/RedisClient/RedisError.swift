/// Why a command failed, as a closed set of kinds callers switch on (`error.code == .timeout`);
/// the message is for people and never contains a password.
public struct RedisError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable, Equatable, CaseIterable {
        /// No answer within the command's timeout (connecting included).
        case timeout
        /// The server could not be reached, or the connection broke.
        case connection
        /// The server is known to be unreachable and the pool is waiting before trying again:
        /// failed at once, without I/O.
        case unavailable
        /// The server refused the credentials (`WRONGPASS`, `NOAUTH`, `NOPERM`).
        case authentication
        /// The TLS handshake failed (certificate, version, plain-text server).
        case tls
        /// The server answered the command with an error.
        case server
        /// The server sent something that is not RESP.
        case protocolViolation
        /// The pool was shut down.
        case shutdown
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }

    public static func == (a: RedisError, b: RedisError) -> Bool { a.code == b.code && a.message == b.message }
}
