import NIOCore
import PorticoTesting
@testable import RedisClient
import Testing

@Suite("RESP parser")
struct RESPParserTests {
    let parser = RESPParser()

    func parse(_ text: String) throws -> RESPValue? {
        var buffer = ByteBuffer(string: text)
        return try parser.parse(&buffer)
    }

    @Test("every RESP2 and RESP3 type", arguments: [
        ("+OK\r\n", RESPValue.simpleString("OK")),
        ("-ERR wrong\r\n", .error("ERR wrong")),
        (":-42\r\n", .integer(-42)),
        ("$5\r\nhe\r\no\r\n", .bulkString(Array("he\r\no".utf8))),
        ("$0\r\n\r\n", .bulkString([])),
        ("$-1\r\n", .null),
        ("*-1\r\n", .null),
        ("*2\r\n:1\r\n$1\r\na\r\n", .array([.integer(1), .bulkString([97])])),
        ("_\r\n", .null),
        (",3.25\r\n", .double(3.25)),
        (",-inf\r\n", .double(-.infinity)),
        ("#t\r\n", .boolean(true)),
        ("#f\r\n", .boolean(false)),
        ("(12345678901234567890123\r\n", .bigNumber("12345678901234567890123")),
        ("!10\r\nERR a\r\nb c\r\n", .error("ERR a\r\nb c")),
        ("=8\r\ntxt:abcd\r\n", .verbatimString("abcd")),
        ("%1\r\n+k\r\n:1\r\n", .map([RESPPair(.simpleString("k"), .integer(1))])),
        ("~2\r\n:1\r\n:2\r\n", .array([.integer(1), .integer(2)])),
        (">2\r\n+message\r\n+x\r\n", .array([.simpleString("message"), .simpleString("x")])),
        ("|1\r\n+ttl\r\n:3\r\n:7\r\n", .integer(7)),
    ])
    func types(_ input: String, _ expected: RESPValue) throws {
        #expect(try parse(input) == expected)
    }

    @Test("a value split anywhere parses the same once complete, and not before")
    func splitAnywhere() throws {
        let whole = Array("*3\r\n$3\r\nabc\r\n%1\r\n+k\r\n,1.5\r\n*1\r\n:9\r\n".utf8)
        let expected = try parser.parseAll(whole).values
        #expect(expected.count == 1)
        for cut in 1..<whole.count {
            var buffer = ByteBuffer(bytes: whole[..<cut])
            #expect(try parser.parse(&buffer) == nil, "cut at \(cut)")
            #expect(buffer.readableBytes == cut, "nothing consumed at \(cut)")
            buffer.writeBytes(whole[cut...])
            #expect(try parser.parse(&buffer) == expected.first, "cut at \(cut)")
            #expect(buffer.readableBytes == 0)
        }
    }

    @Test("malformed replies are refused, not guessed at", arguments: [
        "?\r\n", ":12a\r\n", ":\r\n", "$-2\r\n", "$3\r\nabcd\r\n", "+OK\n", "+O\rK\r\n", "#x\r\n", ",1.2.3x\r\n",
        "(12a\r\n", "_x\r\n", "=2\r\nab\r\n", "%-1\r\n", "~-1\r\n", ":99999999999999999999\r\n", "$99999999999\r\n",
    ])
    func malformed(_ input: String) {
        #expect(throws: RESPParser.Failure.self) { _ = try parse(input) }
    }

    @Test("nesting, element counts and string lengths are bounded")
    func limits() {
        let deep = String(repeating: "*1\r\n", count: 100) + ":1\r\n"
        #expect(throws: RESPParser.Failure.self) { _ = try parse(deep) }
        let small = RESPParser(maxBulkBytes: 4, maxElements: 3)
        var long = ByteBuffer(string: "$5\r\nabcde\r\n")
        #expect(throws: RESPParser.Failure.self) { _ = try small.parse(&long) }
        var many = ByteBuffer(string: "*4\r\n")
        #expect(throws: RESPParser.Failure.self) { _ = try small.parse(&many) }
    }

    @Test("commands are arrays of bulk strings")
    func commandEncoding() {
        var buffer = ByteBuffer()
        RESPEncoder.writeCommand(["SET", .bytes([0, 13, 10]), "é"], into: &buffer)
        #expect(String(buffer: buffer) == "*3\r\n$3\r\nSET\r\n$3\r\n\0\r\n\r\n$2\r\né\r\n")
    }

    typealias Seeded = SplitMix64

    static func randomValue(_ random: inout Seeded, depth: Int = 0) -> RESPValue {
        func text() -> String {
            let alphabet = Array("abcXYZ019 :-_é😀")
            return String((0..<Int.random(in: 0...8, using: &random)).map { _ in alphabet.randomElement(using: &random)! })
        }
        let kinds = depth >= 4 ? 9 : 11
        switch Int.random(in: 0..<kinds, using: &random) {
        case 0: return .simpleString(text())
        case 1: return .error("ERR " + text() + (Bool.random(using: &random) ? "\r\nsecond line" : ""))
        case 2: return .integer(Int64.random(in: .min ... .max, using: &random))
        case 3: return .bulkString((0..<Int.random(in: 0...20, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) })
        case 4: return .null
        case 5: return .double([0.5, -1e300, 3.0, .infinity, -.infinity, 1e-9].randomElement(using: &random)!)
        case 6: return .boolean(Bool.random(using: &random))
        case 7: return .bigNumber((Bool.random(using: &random) ? "-" : "") + String(UInt64.random(in: 0...UInt64.max, using: &random)) + "123")
        case 8: return .verbatimString(text())
        case 9: return .array((0..<Int.random(in: 0...4, using: &random)).map { _ in randomValue(&random, depth: depth + 1) })
        default:
            return .map((0..<Int.random(in: 0...3, using: &random)).map { _ in
                RESPPair(randomValue(&random, depth: depth + 1), randomValue(&random, depth: depth + 1))
            })
        }
    }

    @Test("property: any value encodes and parses back to itself, whole or in random pieces")
    func roundTrip() throws {
        var random = Seeded(state: 24)
        for _ in 0..<2_000 {
            let values = (0..<Int.random(in: 1...3, using: &random)).map { _ in Self.randomValue(&random) }
            let bytes = values.flatMap(RESPEncoder.bytes)
            #expect(try parser.parseAll(bytes).values == values)
            // The same bytes arriving in random pieces, as reads from a socket would.
            var buffer = ByteBuffer()
            var parsed: [RESPValue] = []
            var offset = 0
            while offset < bytes.count {
                let size = Int.random(in: 1...max(1, bytes.count - offset), using: &random)
                buffer.writeBytes(bytes[offset..<offset + size])
                offset += size
                while buffer.readableBytes > 0, let value = try parser.parse(&buffer) { parsed.append(value) }
            }
            #expect(parsed == values)
        }
    }

    /// What parsing a byte string comes to: the values read, then either a refusal or how many
    /// bytes are left waiting for the rest of a value.
    struct Outcome: Equatable, CustomStringConvertible {
        var values: [RESPValue] = []
        var refused = false
        var waiting = 0
        var description: String { "\(values.count) values, " + (refused ? "refused" : "\(waiting) bytes waiting") }
    }

    /// Feeds `bytes` to the parser in the pieces `cuts` gives, as reads from a socket would arrive.
    func outcome(_ bytes: [UInt8], pieces: [Int]) -> Outcome {
        var result = Outcome()
        var buffer = ByteBuffer()
        var offset = 0
        for size in pieces {
            buffer.writeBytes(bytes[offset..<offset + size])
            offset += size
            do {
                while buffer.readableBytes > 0 {
                    let before = buffer.readableBytes
                    guard let value = try parser.parse(&buffer) else {
                        // Waiting for more consumes nothing: the next read completes the same value.
                        #expect(buffer.readableBytes == before, "a parse that returned nil consumed bytes")
                        break
                    }
                    result.values.append(value)
                }
            } catch {
                result.refused = true
                return result
            }
        }
        result.waiting = buffer.readableBytes
        return result
    }

    @Test("property: random bytes are read, refused or waited on the same whole or in pieces; never a crash; what is read round-trips")
    func noise() throws {
        var random = Seeded(state: 7)
        let pieces = ["*", "$", "%", "|", "~", ">", ":", "+", "-", "!", "=", "_", "#", ",", "(", "\r\n", "\r", "\n",
                      "-1", "0", "1", "3", "99999999999", "t", "f", "inf", "txt:", "a"]
        var read = 0, refused = 0, waiting = 0
        for _ in 0..<20_000 {
            let text = (0..<Int.random(in: 1...12, using: &random)).map { _ in pieces.randomElement(using: &random)! }.joined()
            let bytes = Array(text.utf8)
            let whole = outcome(bytes, pieces: [bytes.count])
            var cuts: [Int] = []
            var left = bytes.count
            while left > 0 {
                let size = Int.random(in: 1...left, using: &random)
                cuts.append(size)
                left -= size
            }
            let split = outcome(bytes, pieces: cuts)
            #expect(split == whole, "\(text.debugDescription) in pieces \(cuts): \(split), whole: \(whole)")
            // A value read from noise is a well-formed value: written out again, it reads back the same.
            for value in whole.values {
                let again = try parser.parseAll(RESPEncoder.bytes(value))
                #expect(again.values == [value] && !again.incomplete, "\(text.debugDescription): \(value)")
            }
            read += whole.values.count
            if whole.refused { refused += 1 } else if whole.waiting > 0 { waiting += 1 }
        }
        // The noise reaches all three outcomes, or the property says little.
        #expect(read > 100 && refused > 100 && waiting > 100, "read \(read), refused \(refused), waiting \(waiting)")
    }
}
