import HTTPTypes
import Logging
import MetricsTestKit
import NIOCore
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// Log lines kept in memory, formatted as the executable would write them (logfmt).
final class RecordedLogs: Sendable {
    private let lines = Synchronization.Mutex<[String]>([])
    var all: [String] { lines.withLock { $0 } }

    var logger: Logger {
        Logger(label: "test") { label in
            StructuredLogHandler(label: label, format: .logfmt, level: .info) { line in self.lines.withLock { $0.append(line) } }
        }
    }
}

enum CompressFixture {
    static let json: [UInt8] = Array(("[" + (0..<400).map { #"{"id":\#($0),"name":"item-\#($0)","ok":true}"# }
        .joined(separator: ",") + "]").utf8)

    static func request(_ method: HTTPRequest.Method = .get, acceptEncoding: String? = "gzip",
                        headers: [(String, String)] = []) -> GatewayRequest {
        var fields = HTTPFields()
        if let acceptEncoding { fields[.acceptEncoding] = acceptEncoding }
        for (name, value) in headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        return GatewayRequest(head: HTTPRequest(method: method, scheme: "http", authority: "gw", path: "/items",
                                                headerFields: fields))
    }

    static func response(_ status: Int = 200, type: String? = "application/json", body: [UInt8] = json,
                         headers: [(String, String)] = []) -> GatewayResponse {
        var fields = HTTPFields()
        if let type { fields[.contentType] = type }
        fields[.contentLength] = String(body.count)
        for (name, value) in headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        return GatewayResponse(status: HTTPResponse.Status(code: status), headerFields: fields, body: Body(bytes: body))
    }

    static func context(logs: RecordedLogs = RecordedLogs()) -> RequestContext {
        let clock = ManualClock()
        return RequestContext(requestID: "r1", route: "api", deadline: clock.now.advanced(by: .seconds(30)),
                              logger: logs.logger, clock: clock)
    }

    /// Runs `response` through a `compress` middleware for `request`.
    static func run(_ request: GatewayRequest, _ response: GatewayResponse, config: CompressConfig = CompressConfig(),
                    metrics: TestMetrics = TestMetrics(), logs: RecordedLogs = RecordedLogs()) async throws -> GatewayResponse {
        let middleware = CompressMiddleware(config, metricsFactory: metrics)
        return try await middleware.handle(request, context: context(logs: logs)) { _, _ in response }
    }
}

extension GatewayResponse {
    func header(_ name: String) -> String? { headerFields[HTTPField.Name(name)!] }
    func headers(_ name: String) -> [String] { headerFields[values: HTTPField.Name(name)!] }
}

@Suite("compress middleware")
struct CompressMiddlewareTests {
    typealias F = CompressFixture

    @Test("a JSON body becomes gzip that decompresses to the same bytes, with its headers fixed")
    func compresses() async throws {
        let original = F.response(headers: [("ETag", #""v1""#), ("Accept-Ranges", "bytes"), ("Content-Digest", "sha-256=:x:"),
                                            ("Cache-Control", "max-age=60"), ("X-Keep", "yes")])
        let response = try await F.run(F.request(), original)
        let body = response.body.bytes
        #expect(response.header("content-encoding") == "gzip")
        #expect(response.header("content-length") == String(body.count))
        #expect(body.count < F.json.count)
        #expect(try Zlib.decompress(body) == F.json)
        #expect(response.header("vary") == "Accept-Encoding")
        #expect(response.header("etag") == #"W/"v1""#)
        #expect(response.header("accept-ranges") == nil)
        #expect(response.header("content-digest") == nil)
        #expect(response.header("cache-control") == "max-age=60")
        #expect(response.header("x-keep") == "yes")
        #expect(response.header("content-type") == "application/json")
    }

    @Test("sizes around the threshold and slice boundaries round-trip", arguments: [
        1023, 1024, 1025, 256 * 1024 - 1, 256 * 1024, 256 * 1024 + 1, 3 * 1024 * 1024 + 7,
    ])
    func roundTrip(size: Int) async throws {
        let text = Array(String(repeating: #"{"k":"value","n":12345},"#, count: size / 24 + 1).utf8.prefix(size))
        let response = try await F.run(F.request(), F.response(type: "text/plain", body: text))
        if size < 1024 {
            #expect(response.header("content-encoding") == nil)
            #expect(response.body.bytes == text)
        } else {
            #expect(response.header("content-encoding") == "gzip")
            #expect(try Zlib.decompress(response.body.bytes) == text)
        }
    }

    @Test("the client's Accept-Encoding decides; identity responses still say Vary",
          arguments: [("gzip", true), ("br", false), ("identity;q=0", false), ("*;q=0", false), ("gzip;q=0", false)])
    func negotiation(acceptEncoding: String, compressed: Bool) async throws {
        let response = try await F.run(F.request(acceptEncoding: acceptEncoding), F.response(headers: [("ETag", #""v1""#)]))
        #expect((response.header("content-encoding") == "gzip") == compressed)
        #expect(response.header("vary") == "Accept-Encoding")
        if !compressed {
            // Nothing acceptable (identity;q=0) still gets the identity body, not a 406.
            #expect(response.status == .ok)
            #expect(response.body.bytes == F.json)
            #expect(response.header("etag") == #""v1""#)
            #expect(response.header("content-length") == String(F.json.count))
        }
    }

    @Test("no Accept-Encoding: identity, with Vary")
    func absentHeader() async throws {
        let response = try await F.run(F.request(acceptEncoding: nil), F.response())
        #expect(response.header("content-encoding") == nil)
        #expect(response.body.bytes == F.json)
        #expect(response.header("vary") == "Accept-Encoding")
    }

    struct Untouched: Sendable, CustomTestStringConvertible {
        var name: String
        var response: GatewayResponse
        var requestHeaders: [(String, String)] = []
        var testDescription: String { name }
    }

    static let untouchedCases: [Untouched] = [
        Untouched(name: "encoded", response: F.response(headers: [("Content-Encoding", "br")])),
        Untouched(name: "encoded gzip", response: F.response(headers: [("Content-Encoding", "gzip")])),
        Untouched(name: "response no-transform", response: F.response(headers: [("Cache-Control", "public, No-Transform")])),
        Untouched(name: "request no-transform", response: F.response(), requestHeaders: [("Cache-Control", "no-transform")]),
        Untouched(name: "206", response: F.response(206, headers: [("Content-Range", "bytes 0-3999/9000")])),
        Untouched(name: "Content-Range on 200", response: F.response(headers: [("Content-Range", "bytes 0-3999/9000")])),
        Untouched(name: "204", response: F.response(204, body: [])),
        Untouched(name: "image", response: F.response(type: "image/png")),
        Untouched(name: "no type", response: F.response(type: nil)),
        Untouched(name: "event stream", response: F.response(type: "text/event-stream")),
        Untouched(name: "small", response: F.response(body: Array(#"{"ok":true}"#.utf8))),
    ]

    @Test("already encoded, no-transform, ranges, other types and small bodies are left exactly as they are",
          arguments: untouchedCases)
    func untouched(_ row: Untouched) async throws {
        var original = row.response
        original.headerFields[.eTag] = #""v1""#
        let response = try await F.run(F.request(headers: row.requestHeaders), original)
        #expect(response.headerFields == original.headerFields)
        if let difference = ByteDifference(response.body.bytes, expected: original.body.bytes) { Issue.record("\(difference)") }
    }

    @Test("no-transform inside a quoted Cache-Control argument is not the directive (the list is read with its quotes)")
    func quotedNoTransform() async throws {
        let response = try await F.run(F.request(), F.response(headers: [("Cache-Control", #"private="x,no-transform=1", max-age=5"#)]))
        #expect(response.header("content-encoding") == "gzip")
    }

    @Test("Content-Encoding: identity counts as no coding and is replaced")
    func identityCoding() async throws {
        let response = try await F.run(F.request(), F.response(headers: [("Content-Encoding", "identity")]))
        #expect(response.headers("content-encoding") == ["gzip"])
    }

    @Test("Vary is merged: one line, no duplicates, Vary: * left alone", arguments: [
        ([String](), "Accept-Encoding"),
        (["Origin"], "Origin, Accept-Encoding"),
        (["Origin", "Cookie, origin"], "Origin, Cookie, Accept-Encoding"),
        (["accept-encoding"], "accept-encoding"),
        (["Origin", "Accept-Encoding"], "Origin, Accept-Encoding"),
        (["Origin, *"], "Origin, *"),
    ])
    func varyMerge(existing: [String], expected: String) async throws {
        let response = try await F.run(F.request(), F.response(headers: existing.map { ("Vary", $0) }))
        #expect(response.headers("vary") == [expected])
        #expect(response.header("content-encoding") == "gzip")
    }

    @Test("ETags: strong becomes weak, weak stays, malformed is dropped", arguments: [
        (#""abc""#, #"W/"abc""#), (#"W/"abc""#, #"W/"abc""#), ("abc", nil),
    ])
    func etags(original: String, expected: String?) async throws {
        let response = try await F.run(F.request(), F.response(headers: [("ETag", original)]))
        #expect(response.header("etag") == expected)
    }

    @Test("HEAD: the GET's Vary and weak ETag, the identity Content-Length, no Content-Encoding")
    func head() async throws {
        let original = F.response(body: [], headers: [("ETag", #""v1""#)]).with(contentLength: 50_000)
        let response = try await F.run(F.request(.head), original)
        #expect(response.header("content-encoding") == nil)
        #expect(response.header("content-length") == "50000")
        #expect(response.header("vary") == "Accept-Encoding")
        #expect(response.header("etag") == #"W/"v1""#)
        #expect(response.body.bytes.isEmpty)

        let small = try await F.run(F.request(.head), F.response(body: [], headers: [("ETag", #""v1""#)]).with(contentLength: 10))
        #expect(small.header("vary") == nil)
        #expect(small.header("etag") == #""v1""#)
    }

    @Test("304: Vary and the weak ETag the compressed 200 had, for clients that take gzip")
    func notModified() async throws {
        let original = F.response(304, type: nil, body: [], headers: [("ETag", #""v1""#)])
        let gzip = try await F.run(F.request(), original)
        #expect(gzip.header("etag") == #"W/"v1""#)
        #expect(gzip.header("vary") == "Accept-Encoding")
        #expect(gzip.body.bytes.isEmpty)
        let identity = try await F.run(F.request(acceptEncoding: nil), original)
        #expect(identity.headerFields == original.headerFields)
        let image = try await F.run(F.request(), F.response(304, type: "image/png", body: [], headers: [("ETag", #""v1""#)]))
        #expect(image.header("etag") == #""v1""#)
    }

    @Test("incompressible bodies go out as they came, still with Vary")
    func incompressible() async throws {
        let noise = RandomBytes.make(20_000)
        let metrics = TestMetrics()
        let response = try await F.run(F.request(), F.response(body: noise, headers: [("ETag", #""v1""#)]), metrics: metrics)
        #expect(response.header("content-encoding") == nil)
        if let difference = ByteDifference(response.body.bytes, expected: noise) { Issue.record("\(difference)") }
        #expect(response.header("etag") == #""v1""#)
        #expect(response.header("vary") == "Accept-Encoding")
        #expect(try metrics.expectCounter("portico_compress_responses_total", [("route", "api"), ("result", "incompressible")]).totalValue == 1)
    }

    @Test("a zlib failure sends identity and logs why")
    func zlibFailure() async throws {
        var config = CompressConfig()
        config.level = 42  // past the loader's checks: deflateInit2 refuses it
        let logs = RecordedLogs()
        let metrics = TestMetrics()
        let response = try await F.run(F.request(), F.response(), config: config, metrics: metrics, logs: logs)
        #expect(response.header("content-encoding") == nil)
        #expect(response.body.bytes == F.json)
        #expect(response.header("content-length") == String(F.json.count))
        let warnings = logs.all.filter { $0.contains("level=warning") }
        #expect(warnings.count == 1)
        #expect(warnings.first?.contains("uncompressed") == true)
        #expect(warnings.first?.contains("zlib_stage=deflateInit2") == true)
        #expect(try metrics.expectCounter("portico_compress_responses_total", [("route", "api"), ("result", "error")]).totalValue == 1)
    }

    @Test("metrics: bytes in and out of compressed responses, and a count per result")
    func metrics() async throws {
        let metrics = TestMetrics()
        let middleware = CompressMiddleware(CompressConfig(), metricsFactory: metrics)
        var sent = 0
        for _ in 0..<3 {
            let response = try await middleware.handle(F.request(), context: F.context()) { _, _ in F.response() }
            sent += response.body.bytes.count
        }
        _ = try await middleware.handle(F.request(acceptEncoding: "br"), context: F.context()) { _, _ in F.response() }
        #expect(try metrics.expectCounter("portico_compress_input_bytes_total", [("route", "api")]).totalValue == Int64(3 * F.json.count))
        #expect(try metrics.expectCounter("portico_compress_output_bytes_total", [("route", "api")]).totalValue == Int64(sent))
        #expect(try metrics.expectCounter("portico_compress_responses_total", [("route", "api"), ("result", "compressed")]).totalValue == 3)
        #expect(try metrics.expectCounter("portico_compress_responses_total", [("route", "api"), ("result", "not_accepted")]).totalValue == 1)
    }

    @Test("errors from further in pass through untouched")
    func errorsPassThrough() async throws {
        let middleware = CompressMiddleware(CompressConfig(), metricsFactory: TestMetrics())
        await #expect(throws: GatewayError.self) {
            _ = try await middleware.handle(F.request(), context: F.context()) { _, _ in
                throw UpstreamError.connectFailed("down").gatewayError(upstream: "items")
            }
        }
    }

    @Test("random bodies, types and Accept-Encoding values never crash and always decode back")
    func fuzz() async throws {
        var generator = SystemRandomNumberGenerator()
        var config = CompressConfig()
        config.minBytes = 0
        let middleware = CompressMiddleware(config, metricsFactory: TestMetrics())
        let types = ["application/json", "text/html; charset=utf-8", "image/png", "application/problem+json", "TEXT/PLAIN"]
        let accepts = ["gzip", "*", "br;q=1, gzip;q=0.5", "identity;q=0", "", "gzip;q=0"]
        for round in 0..<300 {
            await Task.yield()  // a long loop on one of the few shared threads: let other tests run
            let size = round % 10 == 0 ? Int.random(in: 0...300_000, using: &generator) : Int.random(in: 0...4_000, using: &generator)
            let alphabet = UInt8.random(in: 1...255, using: &generator)
            let body = RandomBytes.make(size, maximum: alphabet)
            let accept = accepts.randomElement(using: &generator)!
            let upstream = F.response(type: types.randomElement(using: &generator)!, body: body)
            let response = try await middleware.handle(F.request(acceptEncoding: accept), context: F.context()) { _, _ in upstream }
            let sent = response.body.bytes
            #expect(response.header("content-length") == String(sent.count))
            if response.header("content-encoding") == "gzip" {
                #expect(sent.count < body.count)
                #expect(try Zlib.decompress(sent) == body)
            } else {
                #expect(sent == body)
            }
        }
    }
}

extension GatewayResponse {
    func with(contentLength: Int) -> GatewayResponse {
        var copy = self
        copy.headerFields[.contentLength] = String(contentLength)
        return copy
    }
}
