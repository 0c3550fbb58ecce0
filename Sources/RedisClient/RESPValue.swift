/// One value of the Redis serialization protocol: RESP2's five types and RESP3's additions.
///
/// Attributes (`|`) are read and dropped by the parser: Portico asks for nothing they carry.
public enum RESPValue: Sendable, Equatable {
    /// `+OK`
    case simpleString(String)
    /// `-ERR …` or a RESP3 blob error `!`: the server refused the command. Not thrown by the
    /// parser; `RedisConnectionPool.send` turns it into `RedisError.server`.
    case error(String)
    /// `:42`
    case integer(Int64)
    /// `$5\r\nhello` (binary-safe).
    case bulkString([UInt8])
    /// `*2…` (RESP2 and RESP3 arrays), `~` sets and `>` pushes.
    case array([RESPValue])
    /// RESP3 `_`, and RESP2's null bulk string `$-1` and null array `*-1`.
    case null
    /// RESP3 `,3.14` (`inf`, `-inf`, `nan` included).
    case double(Double)
    /// RESP3 `#t` / `#f`.
    case boolean(Bool)
    /// RESP3 `(3492890328409238509324850943850943825024385`, kept as its digits.
    case bigNumber(String)
    /// RESP3 `=15\r\ntxt:Some string`: the text after the three-letter format and colon.
    case verbatimString(String)
    /// RESP3 `%`: pairs in the order sent.
    case map([RESPPair])

    /// The value as text when it is a string of any kind.
    public var string: String? {
        switch self {
        case .simpleString(let text), .verbatimString(let text), .bigNumber(let text): text
        case .bulkString(let bytes): String(decoding: bytes, as: UTF8.self)
        default: nil
        }
    }

    /// The value as an integer when it is one (or a string of digits, as RESP2 scripts may return).
    public var int: Int64? {
        switch self {
        case .integer(let value): value
        case .bulkString, .simpleString: string.flatMap { Int64($0) }
        case .double(let value) where value.isFinite && value.rounded() == value && abs(value) < 9e18: Int64(value)
        default: nil
        }
    }

    public var array: [RESPValue]? {
        if case .array(let items) = self { return items }
        return nil
    }
}

/// One key and value of a RESP3 map.
public struct RESPPair: Sendable, Equatable {
    public var key: RESPValue
    public var value: RESPValue

    public init(_ key: RESPValue, _ value: RESPValue) {
        self.key = key
        self.value = value
    }
}
