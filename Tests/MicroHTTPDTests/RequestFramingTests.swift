@testable import MicroHTTPD
import Testing

/// The framing rules on parsed heads; `RequestSmugglingTests` drives the same cases over sockets.
@Suite("Request framing")
struct RequestFramingTests {
    static func status(_ headers: [(String, String)], version: String = "HTTP/1.1") -> Int? {
        RequestFraming.problem(version: version, headers: headers.map { (name: $0.0, value: $0.1) })?.status
    }

    @Test("unambiguous heads pass")
    func accepted() {
        #expect(Self.status([]) == nil)
        #expect(Self.status([("Content-Length", "5")]) == nil)
        #expect(Self.status([("Transfer-Encoding", "chunked")]) == nil)
        #expect(Self.status([("transfer-encoding", "CHUNKED")]) == nil)
        #expect(Self.status([("Content-Length", "5")], version: "HTTP/1.0") == nil)
    }

    @Test("ambiguous or undecodable framing is refused")
    func refused() {
        #expect(Self.status([("Content-Length", "5"), ("Transfer-Encoding", "chunked")]) == 400)
        #expect(Self.status([("Transfer-Encoding", "chunked"), ("content-length", "5")]) == 400)
        #expect(Self.status([("Content-Length", "5"), ("Content-Length", "5")]) == 400)
        #expect(Self.status([("Transfer-Encoding", "chunked")], version: "HTTP/1.0") == 400)
        #expect(Self.status([("Transfer-Encoding", "identity")]) == 400)
        #expect(Self.status([("Transfer-Encoding", "chunked, identity")]) == 400)
        #expect(Self.status([("Transfer-Encoding", "chunked, chunked")]) == 400)
        #expect(Self.status([("Transfer-Encoding", "chunked"), ("Transfer-Encoding", "chunked")]) == 400)
        #expect(Self.status([("Transfer-Encoding", "")]) == 400)
        #expect(Self.status([("Transfer-Encoding", ", chunked")]) == 400)
        #expect(Self.status([("Transfer-Encoding", "xchunked")]) == 400)
        #expect(Self.status([("Transfer-Encoding", "chunked;x=1")]) == 400)
    }

    @Test("other codings before chunked are valid HTTP but not implemented")
    func notImplemented() {
        #expect(Self.status([("Transfer-Encoding", "gzip, chunked")]) == 501)
        #expect(Self.status([("Transfer-Encoding", "gzip"), ("Transfer-Encoding", "chunked")]) == 501)
    }
}
