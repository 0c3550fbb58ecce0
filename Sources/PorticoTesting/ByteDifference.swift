/// How two byte strings differ, summarised for a failure message: both lengths and the first
/// offset where they part, with a few bytes of each from there. A failing `#expect(a == b)` on
/// bodies prints both arrays whole (a 2 KiB body fills a screen, and one test's dumps crowd every
/// other failure out of a recap); compare through this instead, made outside the expectation so
/// that only the summary is printed:
///
///     let difference = ByteDifference(response.body, expected: body)
///     #expect(difference == nil)
public struct ByteDifference: Equatable, Sendable, CustomStringConvertible {
    public let actualCount: Int
    public let expectedCount: Int
    /// The first offset where the two differ (the shorter one's length when one is a prefix of the other).
    public let offset: Int
    private let actualExcerpt: [UInt8]
    private let expectedExcerpt: [UInt8]

    /// `nil` when `actual` and `expected` hold the same bytes.
    public init?(_ actual: some Collection<UInt8>, expected: some Collection<UInt8>) {
        let actual = Array(actual), expected = Array(expected)
        guard actual != expected else { return nil }
        let common = min(actual.count, expected.count)
        let offset = (0..<common).first { actual[$0] != expected[$0] } ?? common
        actualCount = actual.count
        expectedCount = expected.count
        self.offset = offset
        actualExcerpt = Array(actual[offset..<min(actual.count, offset + 16)])
        expectedExcerpt = Array(expected[offset..<min(expected.count, offset + 16)])
    }

    public var description: String {
        "got \(actualCount) bytes, expected \(expectedCount); first difference at offset \(offset): "
            + "got \(Self.show(actualExcerpt)), expected \(Self.show(expectedExcerpt))"
    }

    /// Printable ASCII as text, anything else as `\xNN`; "end" for nothing.
    private static func show(_ bytes: [UInt8]) -> String {
        guard !bytes.isEmpty else { return "end" }
        let text = bytes.map { byte in
            (0x20..<0x7F).contains(byte) && byte != UInt8(ascii: "\\") && byte != UInt8(ascii: "\"")
                ? String(UnicodeScalar(byte)) : "\\x" + (byte < 16 ? "0" : "") + String(byte, radix: 16)
        }.joined()
        return "\"\(text)\""
    }
}
