/// Header names compared the way HTTP compares them (ASCII, case-insensitively) without
/// allocating a lower-cased copy: these run for every header of every request and response.
extension String {
    /// Whether `self` equals `lowercaseName` ignoring ASCII case; `lowercaseName` must be lower case.
    @inlinable
    package func isFieldName(_ lowercaseName: StaticString) -> Bool {
        let other = UnsafeRawBufferPointer(start: lowercaseName.utf8Start, count: lowercaseName.utf8CodeUnitCount)
        guard utf8.count == other.count else { return false }
        var index = 0
        for byte in utf8 {
            let lower = byte &- UInt8(ascii: "A") < 26 ? byte | 0x20 : byte
            if lower != other[index] { return false }
            index += 1
        }
        return true
    }

    /// Whether `self` equals `other` ignoring ASCII case.
    @inlinable
    package func equalsIgnoringASCIICase(_ other: String) -> Bool {
        guard utf8.count == other.utf8.count else { return false }
        return zip(utf8, other.utf8).allSatisfy { a, b in
            a == b || (a | 0x20 == b | 0x20 && (a | 0x20) &- UInt8(ascii: "a") < 26)
        }
    }
}
