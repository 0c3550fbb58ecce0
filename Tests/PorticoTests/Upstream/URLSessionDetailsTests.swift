import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HTTPTypes
import NIOCore
@testable import Portico
import Testing

@Suite struct URLSessionDetailsTests {
    @Test("refused, unresolvable and timed-out connections are told in words, not Foundation codes")
    func failuresInWords() {
        func classify(_ code: URLError.Code, hadResponse: Bool = false) -> UpstreamError {
            URLSessionUpstream.classify(URLError(code), hadResponse: hadResponse, limit: 1)
        }
        #expect(classify(.cannotConnectToHost) == .connectFailed("connection refused"))
        #expect(classify(.cannotFindHost) == .connectFailed("host name not found"))
        #expect(classify(.dnsLookupFailed) == .connectFailed("host name not found"))
        #expect(classify(.timedOut) == .timeout)
        #expect(classify(.networkConnectionLost, hadResponse: true) == .connectionClosed("connection lost"))
        #expect(UpstreamError.connectFailed("host name not found").reaching("files.internal:8080").gatewayError(upstream: "files").message
            == "upstream files: host name not found (files.internal:8080)")
        #expect(UpstreamError.timeout.gatewayError(upstream: "files").message == "upstream files did not answer within the deadline")
    }

    @Test func splitsJoinedSetCookie() {
        let joined = "a=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT; Path=/, b=2, c=x; HttpOnly,d=\"q\""
        #expect(URLSessionUpstream.splitSetCookie(joined) == [
            "a=1; Expires=Wed, 21 Oct 2015 07:28:00 GMT; Path=/", "b=2", "c=x; HttpOnly", "d=\"q\"",
        ])
        #expect(URLSessionUpstream.splitSetCookie("only=1; Expires=Thu, 01 Jan 1970 00:00:00 GMT") ==
            ["only=1; Expires=Thu, 01 Jan 1970 00:00:00 GMT"])
    }

    @Test func joinsDuplicateRequestHeadersForTheDictionary() {
        var fields = HTTPFields()
        fields.append(HTTPField(name: HTTPField.Name("X-A")!, value: "1"))
        fields.append(HTTPField(name: .cookie, value: "a=1"))
        fields.append(HTTPField(name: HTTPField.Name("x-a")!, value: "2"))
        fields.append(HTTPField(name: .cookie, value: "b=2"))
        fields.append(HTTPField(name: .contentLength, value: "5"))
        fields.append(HTTPField(name: .userAgent, value: "client/1"))
        let headers = URLSessionUpstream.headerDictionary(fields)
        // Joined under the first spelling; framing left to curl; curl's own defaults blanked
        // unless the client sent them.
        #expect(headers == ["X-A": "1, 2", "Cookie": "a=1; b=2", "User-Agent": "client/1", "Accept": " ",
                            "Accept-Encoding": " ", "Accept-Language": " ", "Content-Type": " ", "Connection": " ",
                            "Expect": " "])
    }

    @Test func reencodesGzipAndWeakensETag() throws {
        var fields = HTTPFields()
        fields[.contentEncoding] = "gzip"
        fields[.contentLength] = "999"
        fields[.eTag] = "\"v1\""
        fields[HTTPField.Name("Content-MD5")!] = "abc"
        var body = ByteBuffer(string: "hello hello hello")
        try URLSessionUpstream.restoreContentCoding(&fields, body: &body, hasBody: true)
        #expect(fields[.contentEncoding] == "gzip")
        #expect(fields[.eTag] == "W/\"v1\"")
        #expect(fields[HTTPField.Name("Content-MD5")!] == nil)
        #expect(fields[.contentLength] == String(body.readableBytes))
        #expect(try Zlib.decompress(body.readableBytesView) == Array("hello hello hello".utf8))
    }

    @Test func dropsCodingsItCannotReapply() throws {
        var fields = HTTPFields()
        fields[.contentEncoding] = "br"
        fields[.contentLength] = "3"
        var body = ByteBuffer(string: "decoded")
        try URLSessionUpstream.restoreContentCoding(&fields, body: &body, hasBody: true)
        #expect(fields[.contentEncoding] == nil)
        #expect(fields[.contentLength] == "7")
        #expect(body == ByteBuffer(string: "decoded"))
    }

    @Test func leavesBodilessAndUnknownCodingsAlone() throws {
        var fields = HTTPFields()
        fields[.contentEncoding] = "gzip"
        fields[.contentLength] = "28"
        var body = ByteBuffer()
        try URLSessionUpstream.restoreContentCoding(&fields, body: &body, hasBody: false)
        #expect(fields[.contentLength] == "28")
        #expect(body.readableBytes == 0)

        var other = HTTPFields()
        other[.contentEncoding] = "compress"
        other[.eTag] = "\"x\""
        try URLSessionUpstream.restoreContentCoding(&other, body: &body, hasBody: true)
        #expect(other[.eTag] == "\"x\"")
    }
}
