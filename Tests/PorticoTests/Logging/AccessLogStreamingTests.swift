import HTTPTypes
import Logging
import NIOCore
import Portico
import PorticoTesting
import Testing

/// A streamed response's access line is written when its body ends, with what really left.
@Suite("Access log: streamed bodies", .timeLimit(.minutes(1)))
struct AccessLogStreamingTests {
    typealias S = MiddlewareStreamFixture

    struct Setup {
        let clock = ManualClock()
        let capture = LogCapture(message: "request")
        var log: AccessLogMiddleware { AccessLogMiddleware(AccessLogConfig(), logger: capture.logger, clock: clock) }
        var context: RequestContext {
            RequestContext(requestID: "r1", route: "api", upstream: "up", deadline: clock.now.advanced(by: .seconds(30)),
                           logger: Logger(label: "quiet", factory: { _ in SwiftLogNoOpLogHandler() }), clock: clock)
        }
        var line: Logger.Metadata? { capture.records.first }
        func field(_ name: String) -> String? { line?[name]?.description }
    }

    static func request(_ method: HTTPRequest.Method = .get, body: Body = .empty) -> GatewayRequest {
        GatewayRequest(head: HTTPRequest(method: method, scheme: "http", authority: "gw", path: "/items"), body: body,
                       clientAddress: "192.0.2.1")
    }

    @Test("the line is written when the body ends: real bytes_out, ttfb_ms to the first body byte, duration_ms to the end")
    func writtenAtTheEnd() async throws {
        let setup = Setup()
        let (upstream, writer) = S.response(200)
        let clock = setup.clock
        let response = try await setup.log.handle(Self.request(), context: setup.context) { _, _ in
            clock.advance(by: .milliseconds(5))  // the head arrives
            return upstream
        }
        #expect(setup.capture.records.isEmpty)
        let reader = response.body.reader()
        clock.advance(by: .milliseconds(10))
        try await writer.write(S.buffer("abc"))
        _ = try await reader.next()
        clock.advance(by: .milliseconds(20))
        try await writer.write(S.buffer("de"))
        writer.finish()
        _ = try await S.rest(of: reader)
        #expect(setup.capture.records.count == 1)
        #expect(setup.field("status") == "200")
        #expect(setup.field("bytes_out") == "5")
        #expect(setup.field("ttfb_ms") == "15.000")
        #expect(setup.field("duration_ms") == "35.000")
        #expect(setup.field("ended") == "complete")
        #expect(setup.field("error") == nil)
        #expect(setup.field("request_id") == "r1")
    }

    @Test("bytes_out counts what leaves after inner middleware's stages (compression)")
    func countsAfterCompression() async throws {
        let setup = Setup()
        let (upstream, writer) = S.response(200, headers: [("Content-Type", "application/json")])
        let compress = CompressMiddleware(CompressConfig())
        var request = Self.request()
        request.headerFields[.acceptEncoding] = "gzip"
        let response = try await setup.log.handle(request, context: setup.context) { request, context in
            try await compress.handle(request, context: context) { _, _ in upstream }
        }
        #expect(response.headerFields[.contentEncoding] == "gzip")
        let reader = response.body.reader()
        let json = Array(String(repeating: #"{"id":1,"name":"item"},"#, count: 200).utf8)
        try await writer.write(ByteBuffer(bytes: json))
        writer.finish()
        let sent = try await S.rest(of: reader)
        #expect(sent.count < json.count)
        #expect(setup.field("bytes_out") == String(sent.count))
    }

    @Test("ended says how a streamed body ended", arguments: [
        ("upstream_reset", GatewayError(.upstreamConnectionClosed, message: "reset")),
        ("timeout", GatewayError(.upstreamTimeout, message: "idle")),
        ("too_large", GatewayError(.upstreamResponseTooLarge, message: "max_response_bytes")),
        ("client_gone", GatewayError.clientClosedRequest()),
    ])
    func endings(expected: String, failure: GatewayError) async throws {
        let setup = Setup()
        let (upstream, writer) = S.response(200)
        let response = try await setup.log.handle(Self.request(), context: setup.context) { _, _ in upstream }
        let reader = response.body.reader()
        try await writer.write(S.buffer("abc"))
        _ = try await reader.next()
        if failure.kind == .clientClosedRequest {
            reader.close(failure)
        } else {
            writer.fail(failure)
            await #expect(throws: GatewayError.self) { try await reader.next() }
        }
        #expect(setup.capture.records.count == 1)
        #expect(setup.field("ended") == expected)
        #expect(setup.field("bytes_out") == "3")
        #expect(setup.field("error") == failure.kind.name)
        #expect(setup.field("status") == "200")
    }

    @Test("a streamed body dropped unread still gets its line, as client_gone, without ttfb_ms")
    func droppedUnread() async throws {
        let setup = Setup()
        do {
            let (upstream, _) = S.response(200)
            _ = try await setup.log.handle(Self.request(), context: setup.context) { _, _ in upstream }
        }
        #expect(setup.capture.records.count == 1)
        #expect(setup.field("ended") == "client_gone")
        #expect(setup.field("ttfb_ms") == nil)
    }

    @Test("a buffered response is logged at once, as before, with ended complete and ttfb_ms")
    func buffered() async throws {
        let setup = Setup()
        let clock = setup.clock
        _ = try await setup.log.handle(Self.request(), context: setup.context) { _, _ in
            clock.advance(by: .milliseconds(7))
            return GatewayResponse(status: .ok, body: "hello")
        }
        #expect(setup.field("bytes_out") == "5")
        #expect(setup.field("ended") == "complete")
        #expect(setup.field("ttfb_ms") == "7.000")
        #expect(setup.field("duration_ms") == "7.000")
    }

    @Test("bytes_in of a streamed upload is what was read of it")
    func uploadCounted() async throws {
        for readAll in [true, false] {
            let setup = Setup()
            let (upload, uploadWriter) = S.body()
            try await uploadWriter.write(S.buffer("abcd"))
            try await uploadWriter.write(S.buffer("efg"))
            uploadWriter.finish()
            _ = try await setup.log.handle(Self.request(.put, body: upload), context: setup.context) { request, _ in
                let reader = request.body.reader()
                if readAll {
                    _ = try await S.rest(of: reader)
                } else {
                    _ = try await reader.next()
                    reader.close(GatewayError(.upstreamConnectionClosed, message: "the upstream answered early"))
                }
                return GatewayResponse(status: .created)
            }
            #expect(setup.field("bytes_in") == (readAll ? "7" : "4"))
        }
    }
}
