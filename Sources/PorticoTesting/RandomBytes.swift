/// Random test bodies, made eight bytes per generator call.
///
/// Tests run in parallel on Swift concurrency's few threads, so a multi-MiB body built byte by
/// byte in a debug build holds a thread for seconds and starves every other test's requests.
public enum RandomBytes {
    /// `count` bytes, each in `0...maximum` (the modulo bias does not matter for tests).
    public static func make(_ count: Int, maximum: UInt8 = .max) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        var bytes = [UInt8](repeating: 0, count: count)
        bytes.withUnsafeMutableBytes { raw in
            var offset = 0
            while offset + 8 <= count {
                raw.storeBytes(of: generator.next() as UInt64, toByteOffset: offset, as: UInt64.self)
                offset += 8
            }
            var word = generator.next() as UInt64
            while offset < count {
                raw[offset] = UInt8(truncatingIfNeeded: word)
                word >>= 8
                offset += 1
            }
        }
        if maximum < .max {
            let modulus = UInt16(maximum) + 1
            for index in bytes.indices { bytes[index] = UInt8(UInt16(bytes[index]) % modulus) }
        }
        return bytes
    }
}
