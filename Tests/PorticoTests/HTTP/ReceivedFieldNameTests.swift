import HTTPTypes
@testable import Portico
import Testing

@Suite("Field names as received")
struct ReceivedFieldNameTests {
    static let common = [
        "Age", "Via", "Date", "Host", "ETag", "Vary", "Server", "Accept", "Cookie", "Origin", "Expires", "Referer",
        "Location", "Connection", "User-Agent", "Set-Cookie", "Content-Type", "Cache-Control", "Last-Modified",
        "Authorization", "Accept-Ranges", "If-None-Match", "Content-Length", "Accept-Encoding", "Accept-Language",
        "Content-Encoding", "Transfer-Encoding", "If-Modified-Since",
    ]

    @Test("a common name, or any other spelling, gives what validating it gives: the same raw and canonical name",
          arguments: common + common.map { $0.lowercased() } + common.map { $0.uppercased() }
              + ["X-Custom", "x-request-id", "Hos", "Hosts", "Content-Typ", "Etag"])
    func sameAsValidated(raw: String) throws {
        let received = try #require(HTTPField.Name.received(raw))
        let validated = try #require(HTTPField.Name(raw))
        #expect(received.rawName == validated.rawName)
        #expect(received.canonicalName == validated.canonicalName)
    }

    @Test("a name that is not a token is refused", arguments: ["", "Content Type", "Host:", "X-\u{e9}", "A\0B"])
    func notAToken(raw: String) {
        #expect(HTTPField.Name.received(raw) == nil)
    }
}
