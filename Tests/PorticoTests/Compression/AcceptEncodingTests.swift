import Portico
import Testing

@Suite("Accept-Encoding negotiation (RFC 9110 §12.5.3)")
struct AcceptEncodingTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var lines: [String]
        var expected: AcceptEncoding.Choice
        var testDescription: String { lines.map { "\"\($0)\"" }.joined(separator: " + ") + " → \(expected)" }

        init(_ lines: [String], _ expected: AcceptEncoding.Choice) {
            self.lines = lines
            self.expected = expected
        }

        init(_ line: String, _ expected: AcceptEncoding.Choice) {
            self.init([line], expected)
        }
    }

    static let table: [Case] = [
        Case([], .identity),                                   // absent: no preference, identity is safest
        Case("", .identity),                                   // empty: identity only
        Case("   ", .identity),
        Case("gzip", .gzip),
        Case("GZIP", .gzip),                                    // codings are case-insensitive
        Case("x-gzip", .gzip),
        Case("deflate, gzip, br, zstd", .gzip),
        Case("br", .identity),                                  // gzip not listed, no *
        Case("*", .gzip),
        Case("*;q=0", .identity),
        Case("*;q=0, gzip", .gzip),                             // the specific entry wins over *
        Case("gzip;q=0, *", .identity),
        Case("gzip;q=0", .identity),
        Case("gzip;q=0.000", .identity),
        Case("gzip;q=0.001", .gzip),
        Case("gzip;q=0.8", .gzip),                              // unlisted identity ranks below any listed coding
        Case("br;q=1.0, gzip;q=0.8, *;q=0.1", .gzip),
        Case("gzip;Q=1", .gzip),                                // the parameter name too
        Case("gzip ; q = 0.5", .gzip),                          // OWS around ; and =
        Case("  gzip;q=0.5  ,  identity;q=0.4 ", .gzip),
        Case("gzip;q=0.5, identity", .identity),                // identity preferred (1 > 0.5)
        Case("gzip;q=0.5, identity;q=0.5", .gzip),              // a tie goes to gzip
        Case("gzip, identity;q=0", .gzip),
        Case("identity;q=0", .identity),                        // nothing acceptable: identity anyway (no 406)
        Case("identity;q=0, *;q=0", .identity),
        Case("identity", .identity),
        Case("gzip;q=1.0", .gzip),
        Case("gzip;q=1.000", .gzip),
        Case("gzip;q=1.001", .identity),                        // invalid q: the element is dropped
        Case("gzip;q=2", .identity),
        Case("gzip;q=0.5000", .identity),                       // at most three decimals
        Case("gzip;q=-1", .identity),
        Case("gzip;q=", .identity),
        Case("gzip;q=abc", .identity),
        Case("gzip;q=.5", .identity),
        Case("gzip;q=0.5;q=1", .identity),                      // q twice
        Case("gzip;level=9", .identity),                        // parameters other than q are not in the grammar
        Case("gzip;q=abc, *", .gzip),                           // a bad element does not spoil the rest
        Case("gz ip", .identity),                               // not a token
        Case(",,gzip,,", .gzip),                                // empty list elements are allowed
        Case(["br", "gzip;q=0.8"], .gzip),                      // several field lines form one list
        Case(["gzip", "gzip;q=0"], .gzip),                      // the first element for a coding counts
        Case("gzip;q=0.8, gzip", .gzip),
    ]

    @Test("negotiation table", arguments: table)
    func negotiation(_ row: Case) {
        #expect(AcceptEncoding(fieldValues: row.lines).choice == row.expected)
    }

    @Test("qvalue grammar: 0[.ddd] or 1[.000], in thousandths")
    func qvalues() {
        #expect(AcceptEncoding.qvalue("0") == 0)
        #expect(AcceptEncoding.qvalue("0.") == 0)
        #expect(AcceptEncoding.qvalue("0.5") == 500)
        #expect(AcceptEncoding.qvalue("0.25") == 250)
        #expect(AcceptEncoding.qvalue("0.125") == 125)
        #expect(AcceptEncoding.qvalue("1") == 1000)
        #expect(AcceptEncoding.qvalue("1.000") == 1000)
        for bad in ["", "1.5", "1.0001", "0.1234", "2", "01", "0,5", "+0.5", "0.5x", "1e0"] {
            #expect(AcceptEncoding.qvalue(bad) == nil, "\(bad)")
        }
    }

    @Test("elements keep their order, lower-cased, without the invalid ones")
    func parsedElements() {
        let parsed = AcceptEncoding(fieldValues: ["GZip;q=0.7, br, *;q=0.1, bad;q=9"])
        #expect(parsed.elements == [
            .init(coding: "gzip", quality: 700), .init(coding: "br"), .init(coding: "*", quality: 100),
        ])
        #expect(AcceptEncoding(fieldValues: []).elements == nil)
        #expect(AcceptEncoding(fieldValues: [""]).elements == [])
    }

    @Test("arbitrary bytes never crash the parser")
    func fuzz() {
        var generator = SystemRandomNumberGenerator()
        let alphabet = Array("gzipidentity*;q=0.15, \t\"x-é\u{0}".unicodeScalars)
        for _ in 0..<2_000 {
            let length = Int.random(in: 0...40, using: &generator)
            var text = ""
            for _ in 0..<length { text.unicodeScalars.append(alphabet.randomElement(using: &generator)!) }
            let parsed = AcceptEncoding(fieldValues: [text])
            for element in parsed.elements ?? [] {
                #expect((0...1000).contains(element.quality))
            }
            _ = parsed.choice
        }
    }
}
