import Portico
import Testing

@Suite("Request ids")
struct RequestIDTests {
    @Test("generated ids are 32 lowercase hex characters, well-formed, and distinct")
    func generated() {
        var seen = Set<String>()
        for _ in 0..<10_000 {
            let id = RequestID.generate()
            #expect(id.utf8.count == 32)
            #expect(id.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) })
            #expect(RequestID.isWellFormed(id))
            seen.insert(id)
        }
        #expect(seen.count == 10_000)
        // Every hex digit turns up in every position over many ids (no stuck nibble).
        let ids = Array(seen.prefix(2_000))
        for position in 0..<32 {
            let digits = Set(ids.map { Array($0.utf8)[position] })
            #expect(digits.count == 16, "position \(position)")
        }
    }

    @Test("client ids: kept when well-formed, refused when empty, too long or with odd characters", arguments: [
        ("abc-123_X.y:z/+=", true), ("", false), (String(repeating: "a", count: 128), true),
        (String(repeating: "a", count: 129), false), ("a b", false), ("a\r\nb", false), ("ä", false), ("a;b", false),
    ])
    func clientIDs(value: String, expected: Bool) {
        #expect(RequestID.isWellFormed(value) == expected)
    }
}
