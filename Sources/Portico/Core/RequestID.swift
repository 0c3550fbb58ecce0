import MicroHTTPD
import Synchronization

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

    /// The id of a request: the client's `X-Request-ID` when it is well-formed, otherwise a new one.
    static func accepted(from request: ServerRequest) -> String {
        request.header("x-request-id").flatMap { isWellFormed($0) ? $0 : nil } ?? generate()
    }

    /// A new id: 16 bytes as 32 lowercase hex characters. Unique within the process (a counter
    /// under a bijective mix, so ids do not look sequential) and, with 128 bits drawn once per
    /// process from the system's generator, across processes — without a system call per
    /// request. Not a secret: ids are for correlating logs. The counter is the calling thread's
    /// own (`ThreadSequence`): no shared cache line is written per request.
    public static func generate() -> String {
        let count = ThreadSequence.next()
        let words = (mix(seed.0 &+ count), mix(seed.1 ^ (count &* 0x9E37_79B9_7F4A_7C15)))
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

    private static let seed: (UInt64, UInt64) = {
        var generator = SystemRandomNumberGenerator()
        return (generator.next(), generator.next())
    }()

    /// splitmix64's finalizer: a bijection on 64 bits, so distinct inputs give distinct words.
    private static func mix(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
