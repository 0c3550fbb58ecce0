import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HTTPTypes
import NIOCore
@testable import Portico
import PorticoTesting
import Synchronization
import Testing

/// The `urlsession` transport streams large and undeclared response bodies. Pieces are released
/// by the test one at a time (`TestUpstream.Response.streamed`), so order is by gates, not time.
@Suite struct URLSessionStreamingTests {
    /// A body the test feeds piece by piece.
    final class Feed: Sendable {
        let pieces: AsyncStream<[UInt8]>
        let continuation: AsyncStream<[UInt8]>.Continuation

        init() {
            (pieces, continuation) = AsyncStream.makeStream(of: [UInt8].self)
        }

        func send(_ text: String) { continuation.yield(Array(text.utf8)) }

        /// Sends `piece` after `piece` while the upstream's connection is open (it learns of a
        /// close on its next writes); returns how many went, at most `limit`.
        func flood(_ piece: [UInt8], while upstream: TestUpstream, limit: Int) async -> Int {
            var sent = 0
            while upstream.connections.open > 0, sent < limit {
                continuation.yield(piece)
                sent += 1
                await Task.yield()
            }
            return sent
        }
    }

    static func read(_ reader: BodyReader) async throws -> ByteBuffer {
        var whole = ByteBuffer()
        while let chunk = try await reader.next() { whole.writeImmutableBuffer(chunk) }
        return whole
    }

    /// Reads to the end; returns what arrived and the failure that ended it, if any.
    static func readUntilFailure(_ reader: BodyReader) async -> (bytes: Int, error: GatewayError?) {
        var count = 0
        do {
            while let chunk = try await reader.next() { count += chunk.readableBytes }
            return (count, nil)
        } catch {
            return (count, error as? GatewayError)
        }
    }

    static func context(clock: ManualClock, deadlineIn: Duration = .seconds(30), idle: Duration = .seconds(60)) -> RequestContext {
        var context = RequestContext(requestID: "test-stream", route: "test", upstream: "test",
                                     deadline: clock.now.advanced(by: deadlineIn), logger: Fixture.logger, clock: clock)
        context.streamIdleTimeout = idle
        return context
    }

    @Test("the first chunk reaches the reader before the upstream sends the second")
    func firstChunkBeforeSecond() async throws {
        let feed = Feed()
        try await Fixture.withUpstream(.urlsession, script: { $0.route("/s", .streamed(feed.pieces)) }) { _, client in
            feed.send("first")
            let response = try await client.send(Fixture.request(.get, "/s"), context: Fixture.context())
            #expect(response.body.isStreamed)
            #expect(response.body.count == nil)
            #expect(response.values("Transfer-Encoding").isEmpty)
            let reader = response.body.reader()
            #expect(try await reader.next() == ByteBuffer(string: "first"))
            feed.send("second")
            feed.continuation.finish()
            #expect(try await Self.read(reader) == ByteBuffer(string: "second"))
            #expect(reader.isComplete)
        }
    }

    @Test("small declared bodies stay buffered; large declared ones stream with their length")
    func declaredLengthDecides() async throws {
        let small = Fixture.randomBytes(Body.bufferedLimit)
        let large = Fixture.randomBytes(Body.bufferedLimit + 1)
        try await Fixture.withUpstream(.urlsession, script: { upstream in
            upstream.route("/small", TestUpstream.Response(body: small))
            upstream.route("/large", TestUpstream.Response(body: large))
        }) { _, client in
            let buffered = try await client.send(Fixture.request(.get, "/small"), context: Fixture.context())
            #expect(!buffered.body.isStreamed)
            if let difference = ByteDifference(buffered.body.bytes, expected: small) { Issue.record("\(difference)") }
            let streamed = try await client.send(Fixture.request(.get, "/large"), context: Fixture.context())
            #expect(streamed.body.isStreamed)
            #expect(streamed.body.count == large.count)
            #expect(streamed.values("Content-Length") == [String(large.count)])
            let body = try await streamed.body.collect(upTo: .max, tooLarge: .internalError())
            #expect(Array(body.readableBytesView) == large)
            let head = try await client.send(Fixture.request(.head, "/large"), context: Fixture.context())
            #expect(!head.body.isStreamed)
            #expect(head.body.bytes.isEmpty)
        }
    }

    @Test("a 64 MiB response streams through whole")
    func largeResponseStreams() async throws {
        let pieces = 64
        final class Counter: Sendable { let value = Atomic<Int>(0) }
        let pulled = Counter()
        let body = AsyncStream<[UInt8]> {
            let index = pulled.value.add(1, ordering: .relaxed).newValue
            return index <= pieces ? [UInt8](repeating: UInt8(truncatingIfNeeded: index), count: 1024 * 1024) : nil
        }
        try await Fixture.withUpstream(.urlsession, configure: { $0.maxResponseBytes = 128 * 1024 * 1024 },
                                       script: { $0.route("/big", .streamed(body)) }) { _, client in
            let response = try await client.send(Fixture.request(.get, "/big"), context: Fixture.context())
            #expect(response.body.isStreamed)
            let reader = response.body.reader()
            // Piece i is 1 MiB of byte i: each chunk's ends must carry their offsets' values
            // (checking every byte takes a debug build a minute).
            func expected(at offset: Int) -> UInt8 { UInt8(truncatingIfNeeded: offset / (1024 * 1024) + 1) }
            var count = 0
            var misplaced = 0
            while let chunk = try await reader.next() {
                let view = chunk.readableBytesView
                if view.first != expected(at: count) || view.last != expected(at: count + view.count - 1) { misplaced += 1 }
                count += view.count
            }
            #expect(count == pieces * 1024 * 1024)
            #expect(misplaced == 0)
        }
    }

    /// URLSession cannot pause a transfer (see `URLSessionBridge`): while the reader stops, the
    /// stream queues what arrives, and `max_response_bytes` bounds it. Crossing it fails the
    /// stream (and cancels the transfer).
    @Test("a stopped reader holds at most max_response_bytes; crossing it fails the stream")
    func stoppedReaderIsBoundedByTheResponseLimit() async throws {
        let limit = 4 * 1024 * 1024
        final class Counter: Sendable { let value = Atomic<Int>(0) }
        let pulled = Counter()
        // 64 MiB, each piece made when the upstream is ready to write it.
        let body = AsyncStream<[UInt8]> {
            let index = pulled.value.add(1, ordering: .relaxed).newValue
            return index == 1 ? Array("start".utf8) : index <= 65 ? [UInt8](repeating: 7, count: 1024 * 1024) : nil
        }
        try await Fixture.withUpstream(.urlsession, configure: { $0.maxResponseBytes = limit },
                                       script: { $0.route("/flood", .streamed(body)) }) { upstream, client in
            let response = try await client.send(Fixture.request(.get, "/flood"), context: Fixture.context())
            let reader = response.body.reader()
            let first = try #require(try await reader.next())
            #expect(first.readableBytes <= limit)
            // The reader stops until the upstream sent all it had or lost its connection (no
            // sleeping: a yield loop on the upstream's own counts). curl reads ahead of the
            // delegate, so on loopback it may take the whole body before the cancel lands.
            var spins = 0
            while upstream.connections.open > 0, pulled.value.load(ordering: .relaxed) <= 65, spins < 50_000_000 {
                spins += 1
                await Task.yield()
            }
            #expect(spins < 50_000_000)
            let (bytes, error) = await Self.readUntilFailure(reader)
            #expect(first.readableBytes + bytes <= limit)
            #expect(error?.code == "upstream_response_too_large")
            #expect(error?.kind == .upstreamResponseTooLarge)
        }
    }

    @Test("the reader going away closes the upstream connection")
    func readerGoneClosesUpstream() async throws {
        let feed = Feed()
        try await Fixture.withUpstream(.urlsession, script: { $0.route("/s", .streamed(feed.pieces)) }) { upstream, client in
            feed.send("first")
            var response: GatewayResponse? = try await client.send(Fixture.request(.get, "/s"), context: Fixture.context())
            let reader = try #require(response?.body.reader())
            #expect(try await reader.next() == ByteBuffer(string: "first"))
            reader.close(.clientClosedRequest())
            response = nil
            let sent = await feed.flood([UInt8](repeating: 1, count: 16 * 1024), while: upstream, limit: 100_000)
            #expect(sent < 100_000)
            #expect(upstream.connections.open == 0)
        }
    }

    @Test("an upstream closing mid-body: the reader gets the bytes, then a failure")
    func upstreamClosesMidBody() async throws {
        let feed = Feed()
        let declared = Feed()
        try await Fixture.withUpstream(.urlsession, script: { upstream in
            upstream.route("/chunked", .streamed(feed.pieces, end: .close))
            upstream.route("/declared", .streamed(headers: [("Content-Length", "200000")], declared.pieces, end: .close))
        }) { _, client in
            feed.send("partial")
            let response = try await client.send(Fixture.request(.get, "/chunked"), context: Fixture.context())
            let reader = response.body.reader()
            #expect(try await reader.next() == ByteBuffer(string: "partial"))
            feed.continuation.finish()
            let (bytes, error) = await Self.readUntilFailure(reader)
            #expect(bytes == 0)
            #expect(error?.kind == .upstreamConnectionClosed)
            #expect(error?.code == "upstream_unavailable")

            declared.continuation.yield([UInt8](repeating: 2, count: 100_000))
            let short = try await client.send(Fixture.request(.get, "/declared"), context: Fixture.context())
            #expect(short.body.count == 200_000)
            declared.continuation.finish()
            let (shortBytes, shortError) = await Self.readUntilFailure(short.body.reader())
            #expect(shortBytes == 100_000)
            #expect(shortError?.kind == .upstreamConnectionClosed)
        }
    }

    @Test("a declared length over max_response_bytes is refused at the head")
    func declaredTooLargeIsRefused() async throws {
        let feed = Feed()
        try await Fixture.withUpstream(.urlsession, configure: { $0.maxResponseBytes = 100_000 }, script: { upstream in
            upstream.route("/big", .streamed(headers: [("Content-Length", "200000")], feed.pieces))
        }) { _, client in
            let (error, _) = await Fixture.expectGatewayError {
                try await client.send(Fixture.request(.get, "/big"), context: Fixture.context())
            }
            #expect(error?.code == "upstream_response_too_large")
            feed.continuation.finish()
        }
    }

    @Test("the route deadline bounds the head only; silence past stream_idle_timeout fails the stream")
    func idleTimeoutNotDeadline() async throws {
        let feed = Feed()
        let clock = ManualClock()
        try await Fixture.withUpstream(.urlsession, script: { $0.route("/sse", .streamed(feed.pieces)) }) { _, client in
            feed.send("data: 1\n\n")
            let context = Self.context(clock: clock, deadlineIn: .seconds(2), idle: .seconds(5))
            let response = try await client.send(Fixture.request(.get, "/sse"), context: context)
            let reader = response.body.reader()
            #expect(try await reader.next() == ByteBuffer(string: "data: 1\n\n"))
            // Past the route deadline: the stream goes on.
            clock.advance(by: .seconds(3))
            feed.send("data: 2\n\n")
            #expect(try await reader.next() == ByteBuffer(string: "data: 2\n\n"))
            // Silence longer than the idle timeout.
            clock.advance(by: .seconds(6))
            let (bytes, error) = await Self.readUntilFailure(reader)
            #expect(bytes == 0)
            #expect(error?.kind == .upstreamTimeout)
            #expect(error?.code == "upstream_timeout")
            feed.continuation.finish()
        }
    }

    @Test("max_stream_duration ends a stream that keeps sending")
    func maxStreamDuration() async throws {
        let feed = Feed()
        let clock = ManualClock()
        try await Fixture.withUpstream(.urlsession, script: { $0.route("/sse", .streamed(feed.pieces)) }) { _, client in
            feed.send("a")
            var context = Self.context(clock: clock, idle: .seconds(60))
            context.maxStreamDuration = .seconds(10)
            let response = try await client.send(Fixture.request(.get, "/sse"), context: context)
            let reader = response.body.reader()
            #expect(try await reader.next() == ByteBuffer(string: "a"))
            clock.advance(by: .seconds(11))
            let (_, error) = await Self.readUntilFailure(reader)
            #expect(error?.kind == .upstreamTimeout)
            feed.continuation.finish()
        }
    }

    @Test("a gzip body URLSession decodes as it streams goes out as identity, headers to match")
    func streamedGzipHeadersAgree() async throws {
        let plain = Array(String(repeating: "portico streams gzip bodies decoded ", count: 8000).utf8)
        let encoded = try Zlib.compress(plain, format: .gzip)
        let feed = Feed()
        try await Fixture.withUpstream(.urlsession, script: { upstream in
            upstream.route("/gz", .streamed(headers: [("Content-Encoding", "gzip"), ("ETag", "\"v1\""),
                                                      ("Content-Type", "text/plain")], feed.pieces))
        }) { _, client in
            let half = encoded.count / 2
            feed.continuation.yield(Array(encoded[..<half]))
            let response = try await client.send(Fixture.request(.get, "/gz", headers: [("Accept-Encoding", "gzip")]),
                                                 context: Fixture.context())
            #expect(response.body.isStreamed)
            #expect(response.values("Content-Encoding").isEmpty)
            #expect(response.values("Content-Length").isEmpty)
            #expect(response.body.count == nil)
            #expect(response.values("ETag") == ["W/\"v1\""])
            feed.continuation.yield(Array(encoded[half...]))
            feed.continuation.finish()
            let body = try await response.body.collect(upTo: .max, tooLarge: .internalError())
            #expect(Array(body.readableBytesView) == plain)
        }
    }

    @Test("a streamed request body is read whole and sent with its length; over the limit it is a 413")
    func streamedRequestBodyIsBuffered() async throws {
        let payload = Fixture.randomBytes(300_000)
        func streamedRequest() -> GatewayRequest {
            let (stream, writer) = BodyStream.makeStream()
            Task {
                for start in stride(from: 0, to: payload.count, by: 50_000) {
                    try await writer.write(ByteBuffer(bytes: payload[start..<min(start + 50_000, payload.count)]))
                }
                writer.finish()
            }
            var request = Fixture.request(.post, "/echo", headers: [("Content-Type", "application/octet-stream")])
            request.body = Body(stream: stream)
            return request
        }
        try await Fixture.withUpstream(.urlsession, configure: { $0.maxRequestBodyBytes = 1024 * 1024 }) { _, client in
            let response = try await client.send(streamedRequest(), context: Fixture.context())
            let echo = try await response.collected().echo()
            #expect(echo.bodyBytes == payload)
            #expect(echo.values("Content-Length") == [String(payload.count)])
            #expect(echo.values("Transfer-Encoding").isEmpty)
        }
        try await Fixture.withUpstream(.urlsession, configure: { $0.maxRequestBodyBytes = 100_000 }) { upstream, client in
            let (error, _) = await Fixture.expectGatewayError {
                try await client.send(streamedRequest(), context: Fixture.context())
            }
            #expect(error?.status.code == 413)
            #expect(error?.code == "payload_too_large")
            #expect(upstream.hits("/echo") == 0)
        }
    }

    @Test("framing: what streams and what is read whole")
    func framing() throws {
        func head(_ status: Int, _ headers: [String: String]) throws -> HTTPURLResponse {
            try #require(HTTPURLResponse(url: URL(string: "http://x/")!, statusCode: status, httpVersion: "HTTP/1.1",
                                         headerFields: headers))
        }
        let large = String(Body.bufferedLimit + 1)
        #expect(URLSessionUpstream.framing(try head(200, [:]), method: .get) == .stream(length: nil))
        #expect(URLSessionUpstream.framing(try head(200, ["Content-Length": large]), method: .get)
            == .stream(length: Body.bufferedLimit + 1))
        #expect(URLSessionUpstream.framing(try head(200, ["Content-Length": String(Body.bufferedLimit)]), method: .get) == .whole)
        #expect(URLSessionUpstream.framing(try head(200, ["Content-Length": large, "Content-Encoding": "gzip"]), method: .get)
            == .stream(length: nil))
        #expect(URLSessionUpstream.framing(try head(200, ["Content-Length": "100", "Content-Encoding": "gzip"]), method: .get)
            == .whole)
        #expect(URLSessionUpstream.framing(try head(200, [:]), method: .head) == .whole)
        #expect(URLSessionUpstream.framing(try head(204, [:]), method: .get) == .whole)
        #expect(URLSessionUpstream.framing(try head(302, [:]), method: .get) == .whole)
        #expect(URLSessionUpstream.framing(try head(401, [:]), method: .get) == .whole)
        #expect(URLSessionUpstream.framing(try head(503, [:]), method: .get) == .stream(length: nil))
    }
}
