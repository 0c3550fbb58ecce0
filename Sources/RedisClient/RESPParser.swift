import NIOCore

/// Reads RESP2 and RESP3 values from bytes as they arrive.
///
/// `parse` returns `nil` (consuming nothing) until a whole value is buffered, so a reply split
/// over any number of reads comes out the same. Everything a server sends is checked: lengths
/// are bounded, lines end in CRLF, numbers are numbers, nesting is bounded (a reply of a
/// million `*1` cannot exhaust the stack). A violation throws `RESPParser.Failure`; the
/// connection is then unusable (where the next value starts is unknown) and is closed.
public struct RESPParser: Sendable {
    public struct Failure: Error, Sendable, Equatable, CustomStringConvertible {
        public var description: String
    }

    /// The longest bulk string, blob error or verbatim string accepted.
    public var maxBulkBytes: Int
    /// The most elements in one array, set, push or map (pairs count twice).
    public var maxElements: Int
    /// The deepest nesting of aggregates.
    public var maxDepth: Int

    public init(maxBulkBytes: Int = 16 << 20, maxElements: Int = 1 << 20, maxDepth: Int = 32) {
        self.maxBulkBytes = maxBulkBytes
        self.maxElements = maxElements
        self.maxDepth = maxDepth
    }

    /// The next whole value in `buffer`, consumed; `nil` when more bytes are needed.
    public func parse(_ buffer: inout ByteBuffer) throws(Failure) -> RESPValue? {
        let result: Result<(RESPValue, Int)?, Failure> = buffer.withUnsafeReadableBytes { bytes in
            var reader = Reader(bytes: bytes, limits: self)
            do throws(Failure) {
                guard let value = try reader.value(depth: 0) else { return .success(nil) }
                return .success((value, reader.index))
            } catch {
                return .failure(error)
            }
        }
        guard let (value, consumed) = try result.get() else { return nil }
        buffer.moveReaderIndex(forwardBy: consumed)
        return value
    }

    /// Every whole value in `bytes` and whether bytes were left over (an incomplete value).
    public func parseAll(_ bytes: [UInt8]) throws(Failure) -> (values: [RESPValue], incomplete: Bool) {
        var buffer = ByteBuffer(bytes: bytes)
        var values: [RESPValue] = []
        while buffer.readableBytes > 0, let value = try parse(&buffer) { values.append(value) }
        return (values, buffer.readableBytes > 0)
    }

    private struct Reader {
        let bytes: UnsafeRawBufferPointer
        let limits: RESPParser
        var index = 0

        init(bytes: UnsafeRawBufferPointer, limits: RESPParser) {
            self.bytes = bytes
            self.limits = limits
        }

        static let cr = UInt8(ascii: "\r"), lf = UInt8(ascii: "\n")

        mutating func value(depth: Int) throws(Failure) -> RESPValue? {
            guard index < bytes.count else { return nil }
            let type = bytes[index]
            index += 1
            switch type {
            case UInt8(ascii: "+"):
                return try line().map { .simpleString(String(decoding: $0, as: UTF8.self)) }
            case UInt8(ascii: "-"):
                return try line().map { .error(String(decoding: $0, as: UTF8.self)) }
            case UInt8(ascii: ":"):
                guard let text = try line() else { return nil }
                return .integer(try integer(text))
            case UInt8(ascii: "$"):
                guard let length = try length(allowingNull: true) else { return nil }
                if length < 0 { return .null }
                return try blob(length).map { .bulkString(Array($0)) }
            case UInt8(ascii: "!"):
                guard let length = try length(allowingNull: false) else { return nil }
                return try blob(length).map { .error(String(decoding: $0, as: UTF8.self)) }
            case UInt8(ascii: "="):
                guard let length = try length(allowingNull: false) else { return nil }
                guard let body = try blob(length) else { return nil }
                guard body.count >= 4, body[body.startIndex + 3] == UInt8(ascii: ":") else {
                    throw Failure(description: "verbatim string without a three-letter format and colon")
                }
                return .verbatimString(String(decoding: body.dropFirst(4), as: UTF8.self))
            case UInt8(ascii: "*"), UInt8(ascii: "~"), UInt8(ascii: ">"):
                guard let count = try length(allowingNull: type == UInt8(ascii: "*")) else { return nil }
                if count < 0 { return .null }
                return try elements(count, depth: depth).map { .array($0) }
            case UInt8(ascii: "%"), UInt8(ascii: "|"):
                guard let count = try length(allowingNull: false) else { return nil }
                guard count <= limits.maxElements / 2 else { throw Failure(description: "map of \(count) pairs is too large") }
                guard let flat = try elements(count * 2, depth: depth) else { return nil }
                if type == UInt8(ascii: "|") {
                    // An attribute describes the value that follows it: read that one instead.
                    return try value(depth: depth + 1)
                }
                return .map(stride(from: 0, to: flat.count, by: 2).map { RESPPair(flat[$0], flat[$0 + 1]) })
            case UInt8(ascii: "_"):
                guard let text = try line() else { return nil }
                guard text.isEmpty else { throw Failure(description: "null with a payload") }
                return .null
            case UInt8(ascii: "#"):
                guard let text = try line() else { return nil }
                guard text.count == 1 else { throw Failure(description: "boolean must be t or f") }
                switch text.first {
                case UInt8(ascii: "t"): return .boolean(true)
                case UInt8(ascii: "f"): return .boolean(false)
                default: throw Failure(description: "boolean must be t or f")
                }
            case UInt8(ascii: ","):
                guard let text = try line() else { return nil }
                let string = String(decoding: text, as: UTF8.self)
                let valid = !string.isEmpty && string.utf8.allSatisfy { Self.isDoubleByte($0) }
                guard valid, let number = Double(string) else { throw Failure(description: "invalid double") }
                return .double(number)
            case UInt8(ascii: "("):
                guard let text = try line() else { return nil }
                let digits = text.first == UInt8(ascii: "-") ? text.dropFirst() : text[...]
                guard !digits.isEmpty, digits.count <= 10_000, digits.allSatisfy({ (0x30...0x39).contains($0) }) else {
                    throw Failure(description: "invalid big number")
                }
                return .bigNumber(String(decoding: text, as: UTF8.self))
            default:
                throw Failure(description: "unknown type byte 0x\(String(type, radix: 16))")
            }
        }

        static func isDoubleByte(_ byte: UInt8) -> Bool {
            (0x30...0x39).contains(byte) || "+-.eEinfa".utf8.contains(byte)
        }

        /// `count` values one level down.
        mutating func elements(_ count: Int, depth: Int) throws(Failure) -> [RESPValue]? {
            guard depth < limits.maxDepth else { throw Failure(description: "nested deeper than \(limits.maxDepth)") }
            guard count <= limits.maxElements else { throw Failure(description: "aggregate of \(count) elements is too large") }
            var items: [RESPValue] = []
            items.reserveCapacity(min(count, 1024))
            for _ in 0..<count {
                guard let item = try value(depth: depth + 1) else { return nil }
                items.append(item)
            }
            return items
        }

        /// The bytes up to the next CRLF (consumed with it), or nil when no CRLF is buffered yet.
        mutating func line() throws(Failure) -> Slice<UnsafeRawBufferPointer>? {
            var end = index
            while end < bytes.count {
                let byte = bytes[end]
                if byte == Self.cr {
                    guard end + 1 < bytes.count else { return nil }
                    guard bytes[end + 1] == Self.lf else { throw Failure(description: "CR not followed by LF") }
                    let text = bytes[index..<end]
                    index = end + 2
                    return text
                }
                if byte == Self.lf { throw Failure(description: "bare LF in a line") }
                end += 1
                // A line is a type's header or a short string: none is anywhere near this long.
                if end - index > 64 * 1024 { throw Failure(description: "line longer than 64 KiB") }
            }
            return nil
        }

        func integer(_ text: Slice<UnsafeRawBufferPointer>) throws(Failure) -> Int64 {
            let digits = text.first == UInt8(ascii: "-") || text.first == UInt8(ascii: "+") ? text.dropFirst() : text[...]
            guard !digits.isEmpty, digits.count <= 19, digits.allSatisfy({ (0x30...0x39).contains($0) }),
                  let number = Int64(String(decoding: text, as: UTF8.self)) else {
                throw Failure(description: "invalid integer")
            }
            return number
        }

        /// A length line: a count, or -1 (null) where `allowingNull`.
        mutating func length(allowingNull: Bool) throws(Failure) -> Int? {
            guard let text = try line() else { return nil }
            let number = try integer(text)
            if number == -1, allowingNull { return -1 }
            guard number >= 0 else { throw Failure(description: "negative length") }
            guard number <= Int64(Int32.max) else { throw Failure(description: "length too large") }
            return Int(number)
        }

        /// `length` bytes and the CRLF after them.
        mutating func blob(_ length: Int) throws(Failure) -> Slice<UnsafeRawBufferPointer>? {
            guard length <= limits.maxBulkBytes else {
                throw Failure(description: "string of \(length) bytes is longer than \(limits.maxBulkBytes)")
            }
            guard bytes.count - index >= length + 2 else { return nil }
            let body = bytes[index..<index + length]
            guard bytes[index + length] == Self.cr, bytes[index + length + 1] == Self.lf else {
                throw Failure(description: "string not followed by CRLF")
            }
            index += length + 2
            return body
        }
    }
}
