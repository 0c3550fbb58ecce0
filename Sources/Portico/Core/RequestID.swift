/// Request ids: a client's `X-Request-ID` is kept when it is well-formed, otherwise one is made.
public enum RequestID {
    /// At most 128 visible ASCII characters from a conservative set, so it is safe in logs and headers.
    public static func isWellFormed(_ value: String) -> Bool {
        guard !value.isEmpty, value.utf8.count <= 128 else { return false }
        return value.utf8.allSatisfy { byte in
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"),
                 UInt8(ascii: "."), UInt8(ascii: ":"), UInt8(ascii: "/"), UInt8(ascii: "+"), UInt8(ascii: "="):
                true
            default: false
            }
        }
    }

    /// A new random id: 16 bytes as 32 lowercase hex characters.
    public static func generate() -> String {
        var generator = SystemRandomNumberGenerator()
        let words = (generator.next() as UInt64, generator.next() as UInt64)
        // Written straight into the string's storage: this runs once per request.
        return String(unsafeUninitializedCapacity: 32) { buffer in
            func write(_ word: UInt64, at start: Int) {
                for nibble in 0..<16 {
                    let value = UInt8(truncatingIfNeeded: word >> (60 - 4 * UInt64(nibble))) & 0x0F
                    buffer[start + nibble] = value < 10 ? UInt8(ascii: "0") + value : UInt8(ascii: "a") + value - 10
                }
            }
            write(words.0, at: 0)
            write(words.1, at: 16)
            return 32
        }
    }
}
