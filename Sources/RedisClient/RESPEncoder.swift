import NIOCore

/// Writes RESP: commands (an array of bulk strings, the only form a client sends) and, for
/// tests and fakes, any value.
public enum RESPEncoder {
    /// `*N` then each argument as a bulk string.
    public static func writeCommand(_ arguments: [RedisArgument], into buffer: inout ByteBuffer) {
        buffer.writeString("*\(arguments.count)\r\n")
        for argument in arguments {
            switch argument {
            case .bytes(let bytes):
                buffer.writeString("$\(bytes.count)\r\n")
                buffer.writeBytes(bytes)
            case .string(let text):
                buffer.writeString("$\(text.utf8.count)\r\n")
                buffer.writeString(text)
            }
            buffer.writeStaticString("\r\n")
        }
    }

    /// `value` as a server would send it. Errors containing CR or LF, and non-finite doubles,
    /// are written as RESP3 (blob error, `inf`/`nan`), so every value round-trips through the parser.
    public static func write(_ value: RESPValue, into buffer: inout ByteBuffer) {
        switch value {
        case .simpleString(let text):
            if text.utf8.contains(where: { $0 == 13 || $0 == 10 }) {
                buffer.writeString("$\(text.utf8.count)\r\n\(text)\r\n")  // not representable as +
            } else {
                buffer.writeString("+\(text)\r\n")
            }
        case .error(let text):
            if text.utf8.contains(where: { $0 == 13 || $0 == 10 }) {
                buffer.writeString("!\(text.utf8.count)\r\n\(text)\r\n")
            } else {
                buffer.writeString("-\(text)\r\n")
            }
        case .integer(let number):
            buffer.writeString(":\(number)\r\n")
        case .bulkString(let bytes):
            buffer.writeString("$\(bytes.count)\r\n")
            buffer.writeBytes(bytes)
            buffer.writeStaticString("\r\n")
        case .array(let items):
            buffer.writeString("*\(items.count)\r\n")
            for item in items { write(item, into: &buffer) }
        case .null:
            buffer.writeStaticString("_\r\n")
        case .double(let number):
            let text = number.isNaN ? "nan" : number.isInfinite ? (number < 0 ? "-inf" : "inf") : "\(number)"
            buffer.writeString(",\(text)\r\n")
        case .boolean(let flag):
            buffer.writeString(flag ? "#t\r\n" : "#f\r\n")
        case .bigNumber(let digits):
            buffer.writeString("(\(digits)\r\n")
        case .verbatimString(let text):
            buffer.writeString("=\(text.utf8.count + 4)\r\ntxt:\(text)\r\n")
        case .map(let pairs):
            buffer.writeString("%\(pairs.count)\r\n")
            for pair in pairs {
                write(pair.key, into: &buffer)
                write(pair.value, into: &buffer)
            }
        }
    }

    public static func bytes(_ value: RESPValue) -> [UInt8] {
        var buffer = ByteBuffer()
        write(value, into: &buffer)
        return Array(buffer.readableBytesView)
    }
}

/// One argument of a command: binary-safe bytes, or text sent as UTF-8.
public enum RedisArgument: Sendable, Equatable, ExpressibleByStringLiteral {
    case bytes([UInt8])
    case string(String)

    public init(stringLiteral value: String) {
        self = .string(value)
    }
}
