import NIOHPACK
import NIOHTTP1
import Testing
@testable import Portico

/// `HTTP2StreamsHandler`'s pure parts: a stream's window decisions (`HTTP2StreamFlow`) and the
/// heads' mapping to and from HPACK.
@Suite("HTTP/2 streams handler")
struct HTTP2StreamsHandlerTests {
    @Test("a flowing stream's window reopens once half is used; a paused one stays shut until the reader catches up")
    func window() {
        var flow = HTTP2StreamFlow(target: 1000)
        #expect(flow.windowChanged(to: 700) == nil, "more than half left")
        #expect(flow.windowChanged(to: 500) == 500)
        flow.pause()
        #expect(flow.windowChanged(to: 200) == nil, "the reader is behind: shut")
        #expect(flow.windowChanged(to: 0) == nil)
        #expect(flow.resume() == 1000)
        #expect(flow.resume() == nil, "already open")
        flow.endReceived()
        #expect(flow.windowChanged(to: 100) == nil, "nothing more comes after END_STREAM")
        #expect(!flow.isClosed)
        flow.endSent()
        #expect(flow.isClosed)
    }

    @Test("the request head: pseudo-header fields first, Host as :authority, names lower-cased, connection-specific fields dropped")
    func requestHead() {
        var head = HTTPRequestHead(version: .http1_1, method: .POST, uri: "/a?b=c")
        head.headers.add(name: "Host", value: "api.example")
        head.headers.add(name: "Connection", value: "close, X-Hop")
        head.headers.add(name: "X-Hop", value: "1")
        head.headers.add(name: "Keep-Alive", value: "timeout=5")
        head.headers.add(name: "Proxy-Connection", value: "keep-alive")
        head.headers.add(name: "Transfer-Encoding", value: "chunked")
        head.headers.add(name: "Upgrade", value: "websocket")
        head.headers.add(name: "Content-Type", value: "application/json")
        head.headers.add(name: "x-trace", value: "t")
        let block = HTTP2StreamsHandler.requestHeaders(head, scheme: "https")
        let fields = block.map { "\($0.name): \($0.value)" }
        #expect(fields == [":method: POST", ":scheme: https", ":path: /a?b=c", ":authority: api.example",
                           "content-type: application/json", "x-trace: t"])
    }

    @Test("the response head: version 2.0, pseudo-header fields gone, a body without a length chunked, an empty one of length 0")
    func responseHead() {
        let block = HPACKHeaders([(":status", "200"), ("content-type", "text/plain")])
        let streamed = HTTP2StreamsHandler.responseHead(status: 200, block, requestIsHead: false, endStream: false)
        #expect(streamed.version == HTTPVersion(major: 2, minor: 0))
        #expect(streamed.status == .ok)
        #expect(streamed.headers.map { "\($0.name): \($0.value)" } == ["content-type: text/plain", "transfer-encoding: chunked"])
        let empty = HTTP2StreamsHandler.responseHead(status: 200, block, requestIsHead: false, endStream: true)
        #expect(empty.headers["content-length"] == ["0"])
        let sized = HTTP2StreamsHandler.responseHead(status: 200, HPACKHeaders([(":status", "200"), ("content-length", "5")]),
                                                     requestIsHead: false, endStream: false)
        #expect(sized.headers.map { "\($0.name): \($0.value)" } == ["content-length: 5"])
        let noBody = HTTP2StreamsHandler.responseHead(status: 204, HPACKHeaders([(":status", "204")]), requestIsHead: false, endStream: true)
        #expect(noBody.headers.isEmpty)
    }
}
