import HTTPTypes
import MetricsTestKit
import NIOCore
@testable import Portico
import PorticoTesting
import Testing

/// A streamed response is gzipped chunk by chunk as it flows, never buffered whole.
@Suite("compress middleware: streamed responses", .timeLimit(.minutes(1)))
struct CompressStreamingTests {
    typealias F = CompressFixture
    typealias S = MiddlewareStreamFixture

    static func streamed(type: String = "application/json", headers: [(String, String)] = [],
                         length: Int? = nil) -> (GatewayResponse, BodyWriter) {
        S.response(headers: [("Content-Type", type)] + headers, length: length)
    }

    @Test("each chunk leaves compressed and flushed; no Content-Length; the gzip trailer ends it; bytes counted at the end")
    func chunkByChunk() async throws {
        let (upstream, writer) = Self.streamed(headers: [("ETag", #""v1""#), ("Content-Digest", "sha-256=:x:")])
        let metrics = TestMetrics()
        let response = try await F.run(F.request(), upstream, metrics: metrics)
        #expect(response.header("content-encoding") == "gzip")
        #expect(response.header("content-length") == nil)
        #expect(response.body.count == nil)
        #expect(response.header("vary") == "Accept-Encoding")
        #expect(response.header("etag") == #"W/"v1""#)
        #expect(response.header("content-digest") == nil)
        let stage = try #require(response.body.stages.last as? GzipStage)

        let reader = response.body.reader()
        let first = Array(F.json[..<5000])
        try await writer.write(ByteBuffer(bytes: first))
        let firstOut = try #require(try await reader.next())
        // Flushed: the first chunk's output alone inflates to all of the first chunk (the
        // inflater then stops at the limit one byte short of it, rather than finding it truncated).
        let partial = #expect(throws: Zlib.Failure.self) {
            try Zlib.decompress(Array(firstOut.readableBytesView), limit: first.count - 1)
        }
        #expect(partial?.stage == "limit")

        try await writer.write(ByteBuffer(bytes: F.json[5000...]))
        writer.finish()
        let all = Array(firstOut.readableBytesView) + (try await S.rest(of: reader))
        #expect(try Zlib.decompress(all) == F.json)
        #expect(!stage.holdsZlibState)
        let input = try metrics.expectCounter("portico_compress_input_bytes_total", [("route", "api")])
        let output = try metrics.expectCounter("portico_compress_output_bytes_total", [("route", "api")])
        #expect(input.totalValue == Int64(F.json.count))
        #expect(output.totalValue == Int64(all.count))
        #expect(try metrics.expectCounter("portico_compress_responses_total", [("route", "api"), ("result", "compressed")])
            .totalValue == 1)
    }

    @Test("a chunk larger than zlib's input slice round-trips")
    func largeChunk() async throws {
        let (upstream, writer) = Self.streamed(type: "text/plain")
        let response = try await F.run(F.request(), upstream)
        let text = Array(String(repeating: "line of text 0123456789\n", count: 20_000).utf8)  // ~480 KiB
        #expect(text.count > Zlib.sliceBytes)
        let reader = response.body.reader()
        // Over the stream's high water: the write waits for the reader, so it runs in its own task.
        let feeding = Task {
            try await writer.write(ByteBuffer(bytes: text))
            writer.finish()
        }
        #expect(try Zlib.decompress(try await S.rest(of: reader)) == text)
        try await feeding.value
    }

    @Test("zlib's state is freed however the stream ends: the client leaves, the upstream fails")
    func freedOnEveryEnding() async throws {
        for failing in [false, true] {
            let (upstream, writer) = Self.streamed()
            let response = try await F.run(F.request(), upstream)
            let stage = try #require(response.body.stages.last as? GzipStage)
            let reader = response.body.reader()
            try await writer.write(ByteBuffer(bytes: F.json[..<2000]))
            _ = try await reader.next()
            #expect(stage.holdsZlibState)
            if failing {
                writer.fail(GatewayError(.upstreamConnectionClosed, message: "reset"))
                await #expect(throws: GatewayError.self) { try await reader.next() }
            } else {
                reader.close(.clientClosedRequest())
            }
            #expect(!stage.holdsZlibState, "failing: \(failing)")
        }
    }

    @Test("the same rules as for buffered bodies: event streams, other types, a short declared length, no gzip accepted")
    func sameRules() async throws {
        let eventStream = try await F.run(F.request(), Self.streamed(type: "text/event-stream").0)
        #expect(eventStream.header("content-encoding") == nil)
        #expect(eventStream.body.stages.isEmpty)

        let image = try await F.run(F.request(), Self.streamed(type: "image/png").0)
        #expect(image.body.stages.isEmpty)

        let short = try await F.run(F.request(), Self.streamed(length: 100).0)
        #expect(short.header("content-encoding") == nil)
        #expect(short.body.stages.isEmpty)

        let identity = try await F.run(F.request(acceptEncoding: "identity"), Self.streamed().0)
        #expect(identity.header("content-encoding") == nil)
        #expect(identity.header("vary") == "Accept-Encoding")
        #expect(identity.body.stages.isEmpty)
    }
}
