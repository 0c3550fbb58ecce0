import Foundation
import MicroHTTPD
import PorticoTesting
import Testing

/// Requests refused before any handler runs: each gets exactly one response head, in the
/// server's error shape (`ServerConfiguration.refusalResponse`), and the connection is closed.
@Suite("MicroHTTPD refusals")
struct RefusalTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var name: String
        var request: String
        var status: Int
        var code: String
        var testDescription: String { name }
    }

    static let cases: [Case] = [
        Case(name: "HTTP/1.1 without Host", request: "GET /x HTTP/1.1\r\n\r\n", status: 400, code: "bad_request"),
        Case(name: "absolute-form without Host", request: "GET http://a/x HTTP/1.1\r\n\r\n", status: 400, code: "bad_request"),
        Case(name: "two Host fields", request: "GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", status: 400, code: "bad_request"),
        Case(name: "Host with a space before the colon", request: "GET /x HTTP/1.1\r\nHost : a\r\n\r\n", status: 400, code: "bad_request"),
        Case(name: "a space in the target", request: "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", status: 400, code: "bad_request"),
        Case(name: "a control byte in the target", request: "GET /a\u{1}b HTTP/1.1\r\nHost: a\r\n\r\n", status: 400, code: "bad_request"),
        Case(name: "Content-Length beyond 64 bits",
             request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n", status: 413,
             code: "payload_too_large"),
        Case(name: "Content-Length not a number", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n",
             status: 400, code: "bad_request"),
        Case(name: "Content-Length as a list", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\nx",
             status: 400, code: "bad_request"),
        Case(name: "Content-Length with a sign", request: "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
             status: 400, code: "bad_request"),
    ]

    /// Renders refusals as `code|message`, so the test sees they came from the configured renderer.
    static func configure(_ configuration: inout ServerConfiguration) {
        configuration.threads = 1
        configuration.refusalResponse = { refusal, _, _ in
            let code = switch refusal {
            case .bodyTooLarge: "payload_too_large"
            case .badFraming, .malformedHead: "bad_request"
            default: "other"
            }
            return ServerResponse(status: refusal.status, headers: [("Content-Type", "application/json")],
                                  body: Array("{\"error\":\"\(code)\",\"message\":\"\(refusal.message)\"}".utf8),
                                  closeConnection: true)
        }
    }

    /// Every byte the server sends until it closes, and the status lines in it.
    static func exchange(_ request: String, port: UInt16) async throws -> (bytes: [UInt8], statusLines: Int) {
        let connection = try RawHTTPConnection(port: Int(port))
        try await connection.send(request)
        let bytes = try await connection.readToEnd()
        let text = String(decoding: bytes, as: UTF8.self)
        // Status lines start the response or follow a line end (the JSON bodies have none).
        let statusLines = (text.hasPrefix("HTTP/1.") ? 1 : 0) + text.components(separatedBy: "\r\nHTTP/1.").count - 1
        return (bytes, statusLines)
    }

    @Test("each refusal is one response in the configured shape, then the connection closes", arguments: cases)
    func oneAnswer(row: Case) async throws {
        try await withServer(Self.configure, handler: echo) { server in
            let (bytes, statusLines) = try await Self.exchange(row.request, port: server.port)
            #expect(statusLines == 1, "\(String(decoding: bytes, as: UTF8.self))")
            let response = try #require(RawHTTPResponse.parse(bytes, forHead: false))
            #expect(response.0.status == row.status)
            #expect(response.0.bodyText.hasPrefix("{\"error\":\"\(row.code)\""), "\(response.0.bodyText)")
            #expect(response.0.header("connection")?.lowercased() == "close")
            #expect(response.1 == bytes.count, "bytes after the response")
        }
    }

    @Test("a Content-Length refusal finds its own connection while others on the same thread are mid-head or mid-body")
    func refusalAmongOthers() async throws {
        try await withServer(Self.configure, handler: echo) { server in
            // One thread: all three connections share it.
            let midHead = try RawHTTPConnection(port: Int(server.port))
            try await midHead.send("GET /slow HTTP/1.1\r\nHost: a\r\n")
            let midBody = try RawHTTPConnection(port: Int(server.port))
            try await midBody.send("POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhello")
            // Both are read by the server before the refusal is sent: a request on a third
            // connection answered means the thread has turned past them.
            let probe = try RawHTTPConnection(port: Int(server.port))
            try await probe.send("GET /probe HTTP/1.1\r\nHost: a\r\n\r\n")
            #expect(try await probe.readResponse()?.status == 200)

            let (bytes, statusLines) = try await Self.exchange(
                "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551621\r\n\r\n", port: server.port)
            #expect(statusLines == 1)
            #expect(try #require(RawHTTPResponse.parse(bytes, forHead: false)).0.status == 413)

            // The other two were not touched: they finish normally.
            try await midHead.send("\r\n")
            let slow = try #require(try await midHead.readResponse())
            #expect(slow.status == 200)
            #expect(slow.bodyText.contains("target: /slow"))
            try await midBody.send("world")
            let upload = try #require(try await midBody.readResponse())
            #expect(upload.status == 200)
            #expect(upload.bodyText.contains("body-bytes: 10"))
        }
    }

    @Test("HTTP/1.0 needs no Host, and a keep-alive connection survives a refused neighbour")
    func http10WithoutHost() async throws {
        try await withServer(Self.configure, handler: echo) { server in
            let connection = try RawHTTPConnection(port: Int(server.port))
            try await connection.send("GET /old HTTP/1.0\r\n\r\n")
            let response = try #require(try await connection.readResponse())
            #expect(response.status == 200)
        }
    }
}
