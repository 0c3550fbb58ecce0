@testable import Portico
import Testing

@Suite("List-based field values (RFC 9110 §5.6.1)")
struct HTTPListTests {
    func texts(_ value: String, quoting: HTTPList.Quoting = .quotedString) -> [String] {
        HTTPList(value, quoting: quoting).map { String($0.text) }
    }

    @Test("a comma inside a quoted-string separates nothing")
    func quotedCommas() {
        #expect(texts(#"a, "b,c", d"#) == ["a", #""b,c""#, "d"])
        #expect(texts(#"no-cache="Set-Cookie, X-Token", max-age=5"#) == [#"no-cache="Set-Cookie, X-Token""#, "max-age=5"])
        #expect(texts(#"W/"a,b", "c""#) == [#"W/"a,b""#, #""c""#])
    }

    @Test("a backslash escapes the next byte in a quoted-string; escapes are kept, unquoted(_:) resolves them")
    func escapes() {
        #expect(texts(#""a\"b,c", d"#) == [#""a\"b,c""#, "d"])
        #expect(texts(#""a\\", b"#) == [#""a\\""#, "b"])
        #expect(HTTPList.unquoted(#""a\"b,c""#) == #"a"b,c"#)
        #expect(HTTPList.unquoted(#""a\\b""#) == #"a\b"#)
        #expect(HTTPList.unquoted(#""x"junk"#) == "x")
        #expect(HTTPList.unquoted("token") == "token")
    }

    @Test("entity-tags have no escapes: a backslash before the closing quote is part of the tag")
    func entityTags() {
        #expect(texts(#""a\", "b""#, quoting: .entityTag) == [#""a\""#, #""b""#])
        #expect(texts(#""a\", "b""#) == [#""a\", "b""#])  // as a quoted-string, `\"` is an escaped quote
        #expect(texts(#"W/"x,y", *"#, quoting: .entityTag) == [#"W/"x,y""#, "*"])
    }

    @Test("empty elements are skipped: leading, trailing, repeated, blank")
    func emptyElements() {
        #expect(texts(",, a ,,b,") == ["a", "b"])
        #expect(texts("").isEmpty)
        #expect(texts(" ,\t, ").isEmpty)
        #expect(texts(",") == [])
    }

    @Test("OWS around elements is not part of them; inside, it is kept")
    func ows() {
        #expect(texts(" \ta\t , b ") == ["a", "b"])
        #expect(texts("a b , c") == ["a b", "c"])
        #expect(texts(#"  "q, r"  ,x"#) == [#""q, r""#, "x"])
    }

    @Test("parameters: value before the first ';', then name=value pairs, OWS around ';' and '=' tolerated")
    func parameters() throws {
        let elements = Array(HTTPList(#"gzip;q=0.5, br ; Q = 1 ;level=9, text/html;charset="a;b,c";q=0.9"#))
        #expect(elements.map { String($0.value) } == ["gzip", "br", "text/html"])
        let gzip = Array(elements[0].parameters)
        #expect(gzip.map(\.name) == ["q"] && gzip.map(\.value) == ["0.5"])
        let br = Array(elements[1].parameters)
        #expect(br.map(\.name) == ["Q", "level"] && br.map(\.value) == ["1", "9"])
        let html = Array(elements[2].parameters)
        #expect(html.map(\.name) == ["charset", "q"] && html.map(\.value) == [#""a;b,c""#, "0.9"])
        #expect(HTTPList.unquoted(try #require(html[0].value)) == "a;b,c")
        // An element without parameters has none; its value is the whole element.
        let plain = try #require(HTTPList("identity").first { _ in true })
        #expect(plain.value == "identity" && Array(plain.parameters).isEmpty)
    }

    @Test("odd parameters are reported as they are: empty, without '=', without a value")
    func oddParameters() throws {
        let element = try #require(HTTPList("gzip;;flag;q=").first { _ in true })
        let parameters = Array(element.parameters)
        #expect(parameters.map(\.name) == ["", "flag", "q"])
        #expect(parameters.map(\.value) == [nil, nil, ""])
        let bare = try #require(HTTPList(";q=1").first { _ in true })
        #expect(bare.value == "" && bare.text == ";q=1")
        let trailing = try #require(HTTPList("gzip;").first { _ in true })
        #expect(trailing.value == "gzip" && Array(trailing.parameters).map(\.name) == [""])
    }

    @Test("an unterminated quote runs to the end of the value")
    func unterminatedQuote() {
        #expect(texts(#"a, "b, c"#) == ["a", #""b, c"#])
        #expect(HTTPList.unquoted(#""b, c"#) == "b, c")
        #expect(texts(#"a, "b\"#) == ["a", #""b\"#])
        #expect(HTTPList.unquoted(#""b\"#) == #"b\"#)
        #expect(texts(#"x;p="1, y"#).count == 1)
        #expect(texts("a, \"b, c \t") == ["a", "\"b, c"])  // found by the seeded fuzzer
    }

    @Test("non-ASCII bytes pass through whole")
    func nonASCII() {
        #expect(texts("ü, 😀 ,\"é,è\"") == ["ü", "😀", "\"é,è\""])
    }

    @Test("tokens compare case-insensitively without allocating")
    func caseInsensitive() {
        #expect(HTTPSyntax.equalsIgnoringCase("No-Cache", "no-cache"))
        #expect(HTTPSyntax.equalsIgnoringCase(Substring("NO-CACHE"), "no-cache"))
        #expect(!HTTPSyntax.equalsIgnoringCase("no-cache2", "no-cache"))
        #expect(!HTTPSyntax.equalsIgnoringCase("no-cach", "no-cache"))
        #expect(!HTTPSyntax.equalsIgnoringCase("", "q"))
        #expect(HTTPSyntax.equalsIgnoringCase("", ""))
    }
}
