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
        let hi = generator.next() as UInt64
        let lo = generator.next() as UInt64
        return hex(hi) + hex(lo)
    }

    private static func hex(_ value: UInt64) -> String {
        let s = String(value, radix: 16)
        return String(repeating: "0", count: 16 - s.count) + s
    }
}
