import Foundation
import HTTPTypes
import NIOCore
import Portico
import PorticoTesting
import Synchronization
import Testing

/// The `nio` transport streams both ways (plain and with `server_name`): large and undeclared
/// response bodies flow with backpressure, small ones stay buffered; streamed request bodies go
/// up as they arrive.
@Suite("nio transport: streaming")
struct NIOStreamingTests {
    static let transports: [Transport] = [.nio, .nioServerName]

    /// A body the test feeds piece by piece.
    final class Pieces: Sendable {
        let stream: AsyncStream<[UInt8]>
        let continuation: AsyncStream<[UInt8]>.Continuation
        init() { (stream, continuation) = AsyncStream.makeStream(of: [UInt8].self) }
        func send(_ piece: [UInt8]) { continuation.yield(piece) }
        func end() { continuation.finish() }
    }

    final class Counter: Sendable {
        let value = Atomic<Int>(0)
    }

    static func context(clock: any GatewayClock = SystemClock(), deadlineIn: Duration = .seconds(30),
                        idle: Duration = .seconds(60)) -> RequestContext {
        var context = RequestContext(requestID: "test-\(RequestID.generate())", route: "test", upstream: "test",
                                     deadline: clock.now.advanced(by: deadlineIn), logger: Fixture.logger, clock: clock)
        context.streamIdleTimeout = idle
        return context
    }

    @Test("the first chunk reaches the reader before the upstream sends the second", arguments: transports)
    func firstChunkFirst(transport: Transport) async throws {
        let pieces = Pieces()
        try await Fixture.withUpstream(transport, script: { upstream in
            upstream.route("/sse", .streamed(headers: [("Content-Type", "text/event-stream")], pieces.stream))
        }) { _, client in
            pieces.send(Array("data: one\n\n".utf8))
            let response = try await client.send(Fixture.request(.get, "/sse"), context: Self.context())
            #expect(response.body.isStreamed)
            #expect(response.body.count == nil)
            let reader = response.body.reader()
            var first = ByteBuffer()
            while first.readableBytes < 11, let chunk = try await reader.next() { first.writeImmutableBuffer(chunk) }
            #expect(String(buffer: first) == "data: one\n\n")
            pieces.send(Array("data: two\n\n".utf8))
            pieces.end()
            var rest = ByteBuffer()
            while let chunk = try await reader.next() { rest.writeImmutableBuffer(chunk) }
            #expect(String(buffer: rest) == "data: two\n\n")
        }
    }

    @Test("a 64 MiB response streams whole, the reader's pace holding the upstream back", arguments: transports)
    func largeResponseIsBackpressured(transport: Transport) async throws {
        let pieceSize = 64 * 1024
        let pieceCount = 1024
        let piece = (0..<pieceSize).map { UInt8(truncatingIfNeeded: $0 % 251) }
        let pattern = piece + piece + piece
        let produced = Counter()
        let sent = Counter()
        try await Fixture.withUpstream(transport, configure: { $0.maxResponseBytes = 128 * 1024 * 1024 }, script: { upstream in
            upstream.route("/big") { _ in
                let body = AsyncStream<[UInt8]>(unfolding: {
                    guard sent.value.add(1, ordering: .relaxed).newValue <= pieceCount else { return nil }
                    produced.value.add(pieceSize, ordering: .relaxed)
                    return piece
                })
                return .streamed(headers: [("Content-Length", String(pieceSize * pieceCount))], body)
            }
        }) { _, client in
            let response = try await client.send(Fixture.request(.get, "/big"), context: Self.context())
            #expect(response.body.isStreamed)
            #expect(response.body.count == pieceSize * pieceCount)
            let reader = response.body.reader()
            var consumed = 0
            var intact = true
            func read(upTo target: Int) async throws {
                while consumed < target, let chunk = try await reader.next() {
                    let start = consumed % pieceSize
                    if start + chunk.readableBytes <= pattern.count {
                        let same = chunk.withUnsafeReadableBytes { got in
                            pattern.withUnsafeBytes { memcmp(got.baseAddress!, $0.baseAddress! + start, got.count) == 0 }
                        }
                        if !same { intact = false }
                    } else {
                        for (offset, byte) in chunk.readableBytesView.enumerated()
                        where byte != UInt8((consumed + offset) % pieceSize % 251) {
                            intact = false
                        }
                    }
                    consumed += chunk.readableBytes
                }
            }
            // The reader takes 1 MiB and stops: the upstream must stall, short of the body's end,
            // by what the pipe and the sockets hold (the kernel may buffer tens of MiB on loopback).
            try await read(upTo: 1024 * 1024)
            let stalled = Counter()
            let last = Counter()
            try await Eventually.wait(timeout: .seconds(60), "the upstream stalled") {
                let now = produced.value.load(ordering: .relaxed)
                let unchanged = now == last.value.exchange(now, ordering: .relaxed)
                return (unchanged ? stalled.value.add(1, ordering: .relaxed).newValue : stalled.value.exchange(0, ordering: .relaxed)) >= 250
            }
            let lead = produced.value.load(ordering: .relaxed) - consumed
            #expect(lead < pieceSize * pieceCount - 1024 * 1024, "the upstream ran \(lead) bytes ahead of a stopped reader")
            try await read(upTo: .max)
            #expect(consumed == pieceSize * pieceCount)
            #expect(intact)
        }
    }

    @Test("a reader that goes away closes the upstream connection promptly; the pool still works", arguments: transports)
    func readerGoneClosesTheConnection(transport: Transport) async throws {
        let pieces = Pieces()
        try await Fixture.withUpstream(transport, script: { upstream in
            upstream.route("/endless", .streamed(pieces.stream))
        }) { upstream, client in
            pieces.send(Array(repeating: 0x61, count: 1000))
            var response: GatewayResponse? = try await client.send(Fixture.request(.get, "/endless"), context: Self.context())
            let reader = try #require(response?.body.reader())
            _ = try await reader.next()
            #expect(upstream.connections.open == 1)
            reader.close(.clientClosedRequest())
            response = nil
            // The upstream learns of the close when it writes again.
            try await Eventually.wait(timeout: .seconds(30), "the upstream connection closed") {
                pieces.send(Array(repeating: 0x7A, count: 1024))
                return upstream.connections.open == 0
            }
            let next = try await client.send(Fixture.request(.get, "/echo"), context: Self.context())
            #expect(next.status == .ok)
            #expect(try await next.echo().target == "/echo")
            pieces.end()
        }
    }

    @Test("an upstream closing mid-body fails the reader after the bytes before it", arguments: transports)
    func upstreamClosesMidBody(transport: Transport) async throws {
        let pieces = Pieces()
        try await Fixture.withUpstream(transport, script: { upstream in
            upstream.route("/cut", .streamed(pieces.stream, end: .close))
        }) { _, client in
            pieces.send(Array("partial".utf8))
            let response = try await client.send(Fixture.request(.get, "/cut"), context: Self.context())
            let reader = response.body.reader()
            var received = ByteBuffer()
            while received.readableBytes < 7, let chunk = try await reader.next() { received.writeImmutableBuffer(chunk) }
            #expect(String(buffer: received) == "partial")
            pieces.end()
            await #expect(throws: GatewayError.self) {
                do {
                    while try await reader.next() != nil {}
                } catch let error as GatewayError {
                    #expect(error.kind == .upstreamConnectionClosed)
                    throw error
                }
            }
        }
    }

    @Test("max_response_bytes crossed as the bytes flow fails the stream", arguments: transports)
    func limitCrossedMidStream(transport: Transport) async throws {
        let pieces = Pieces()
        try await Fixture.withUpstream(transport, configure: { $0.maxResponseBytes = 100_000 }, script: { upstream in
            upstream.route("/grows", .streamed(pieces.stream))
        }) { upstream, client in
            pieces.send(Array(repeating: 1, count: 60_000))
            let response = try await client.send(Fixture.request(.get, "/grows"), context: Self.context())
            let reader = response.body.reader()
            var received = 0
            while received < 60_000, let chunk = try await reader.next() { received += chunk.readableBytes }
            pieces.send(Array(repeating: 2, count: 60_000))
            await #expect(throws: GatewayError.self) {
                do {
                    while let chunk = try await reader.next() { received += chunk.readableBytes }
                } catch let error as GatewayError {
                    #expect(error.kind == .upstreamResponseTooLarge)
                    throw error
                }
            }
            #expect(received <= 100_000)
            // The upstream learns of the close when it writes again.
            try await Eventually.wait(timeout: .seconds(30), "the upstream connection closed") {
                pieces.send(Array(repeating: 0x7A, count: 1024))
                return upstream.connections.open == 0
            }
            pieces.end()
        }
    }

    @Test("a silent stream fails after stream_idle_timeout (ManualClock)", arguments: transports)
    func idleTimeout(transport: Transport) async throws {
        let pieces = Pieces()
        let clock = ManualClock()
        try await Fixture.withUpstream(transport, script: { upstream in
            upstream.route("/quiet", .streamed(pieces.stream))
        }) { upstream, client in
            pieces.send(Array("hello".utf8))
            let context = Self.context(clock: clock, idle: .seconds(5))
            let response = try await client.send(Fixture.request(.get, "/quiet"), context: context)
            let reader = response.body.reader()
            var received = ByteBuffer()
            while received.readableBytes < 5, let chunk = try await reader.next() { received.writeImmutableBuffer(chunk) }
            #expect(String(buffer: received) == "hello")
            await clock.waitForSleepers(1)
            clock.advance(by: .seconds(4))
            // Not yet: still waiting.
            await clock.waitForSleepers(1)
            clock.advance(by: .seconds(2))
            // If the watchdog woke while nobody was reading (reads paused: no demand yet), it
            // looks again one idle period later: move the clock on while the read waits. (The
            // loaded CI run of 2026-12-02 hung here: the read waited for a clock nobody moved.)
            let next = Task { () async throws -> ByteBuffer? in try await reader.next() }
            let done = Atomic<Bool>(false)
            let watcher = Task { _ = try? await next.value; done.store(true, ordering: .relaxed) }
            try await Eventually.wait(timeout: .seconds(60), "the waiting read failed") {
                if done.load(ordering: .relaxed) { return true }
                if clock.sleeperCount > 0 { clock.advance(by: .seconds(5)) }
                return false
            }
            _ = await watcher.value
            await #expect(throws: GatewayError.self) {
                do {
                    _ = try await next.value
                } catch let error as GatewayError {
                    #expect(error.kind == .upstreamTimeout)
                    throw error
                }
            }
            // The upstream learns of the close when it writes again.
            try await Eventually.wait(timeout: .seconds(30), "the upstream connection closed") {
                pieces.send(Array(repeating: 0x7A, count: 1024))
                return upstream.connections.open == 0
            }
            pieces.end()
        }
    }

    @Test("a streamed request body arrives whole, with a known length or chunked",
          arguments: transports, [true, false])
    func streamedRequestBody(transport: Transport, knownLength: Bool) async throws {
        let payload = Fixture.randomBytes(3 * 1024 * 1024 + 17)
        try await Fixture.withUpstream(transport) { _, client in
            let (stream, writer) = BodyStream.makeStream(length: knownLength ? payload.count : nil)
            let feeding = Task {
                var offset = 0
                while offset < payload.count {
                    let end = min(offset + 100_000, payload.count)
                    try await writer.write(ByteBuffer(bytes: payload[offset..<end]))
                    offset = end
                }
                writer.finish()
            }
            var request = Fixture.request(.post, "/echo", headers: [("Content-Type", "application/octet-stream")])
            request.body = Body(stream: stream)
            let response = try await client.send(request, context: Self.context())
            try await feeding.value
            let echo = try await response.echo()
            #expect(echo.bodyBytes == payload)
            if knownLength {
                #expect(echo.values("Content-Length") == [String(payload.count)])
                #expect(echo.values("Transfer-Encoding").isEmpty)
            } else {
                #expect(echo.values("Transfer-Encoding").map { $0.lowercased() } == ["chunked"])
                #expect(echo.values("Content-Length").isEmpty)
            }
        }
    }

    @Test("a 10-second upload on a route with a 2 s timeout is not cut while bytes flow (ManualClock)",
          arguments: transports)
    func longUploadOutlivesTheRouteTimeout(transport: Transport) async throws {
        let clock = ManualClock()
        try await Fixture.withUpstream(transport) { upstream, client in
            // A high water of one byte: each write returns once the transport has taken it, so
            // the clock moves between chunks the transport has seen.
            let (stream, writer) = BodyStream.makeStream(length: nil, highWater: 1)
            var request = Fixture.request(.post, "/echo")
            request.body = Body(stream: stream)
            let context = Self.context(clock: clock, deadlineIn: .seconds(2), idle: .seconds(5))
            async let answer = client.send(request, context: context)
            for second in 0..<10 {
                try await writer.write(ByteBuffer(string: "second \(second)\n"))
                // Time passes on the gateway's clock while the upload goes on.
                clock.advance(by: .seconds(1))
            }
            writer.finish()
            let response = try await answer
            #expect(response.status == .ok)
            let echo = try await response.echo()
            #expect(String(decoding: echo.bodyBytes, as: UTF8.self) == (0..<10).map { "second \($0)\n" }.joined())
            #expect(upstream.hits("/echo") == 1)
        }
    }

    @Test("an upload that stalls fails after stream_idle_timeout (ManualClock)", arguments: transports)
    func stalledUpload(transport: Transport) async throws {
        let clock = ManualClock()
        try await Fixture.withUpstream(transport) { _, client in
            let (stream, writer) = BodyStream.makeStream(length: nil, highWater: 1)
            var request = Fixture.request(.post, "/echo")
            request.body = Body(stream: stream)
            let context = Self.context(clock: clock, idle: .seconds(5))
            let answer = Task { try await client.send(request, context: context) }
            try await writer.write(ByteBuffer(string: "the start, then nothing"))
            await clock.waitForSleepers(1)
            clock.advance(by: .seconds(6))
            let (error, _) = await Fixture.expectGatewayError { try await answer.value }
            #expect(error?.kind == .requestTimeout)
            #expect(error?.message.contains("stream_idle_timeout") == true, "\(String(describing: error))")
            withExtendedLifetime(writer) {}
        }
    }

    @Test("the route timeout bounds the head only: a streamed response outlives it (ManualClock)", arguments: transports)
    func streamOutlivesTheRouteTimeout(transport: Transport) async throws {
        let pieces = Pieces()
        let clock = ManualClock()
        try await Fixture.withUpstream(transport, script: { upstream in
            upstream.route("/ticks", .streamed(pieces.stream))
        }) { _, client in
            pieces.send(Array("tick 0\n".utf8))
            let context = Self.context(clock: clock, deadlineIn: .seconds(2), idle: .seconds(5))
            let response = try await client.send(Fixture.request(.get, "/ticks"), context: context)
            let reader = response.body.reader()
            var received = ByteBuffer()
            for tick in 1...10 {
                while received.readableBytes < 7 * tick, let chunk = try await reader.next() { received.writeImmutableBuffer(chunk) }
                clock.advance(by: .seconds(1))
                pieces.send(Array("tick \(tick % 10)\n".utf8))
            }
            pieces.end()
            while let chunk = try await reader.next() { received.writeImmutableBuffer(chunk) }
            #expect(String(buffer: received) == (0...10).map { "tick \($0 % 10)\n" }.joined())
        }
    }

    @Test("small responses stay buffered: declared up to 64 KiB", arguments: transports)
    func smallResponsesAreBuffered(transport: Transport) async throws {
        let exact = Fixture.randomBytes(Body.bufferedLimit)
        try await Fixture.withUpstream(transport, script: { upstream in
            upstream.route("/exact", TestUpstream.Response(status: 200, body: exact))
            upstream.route("/over", TestUpstream.Response(status: 200, body: exact + [1]))
        }) { _, client in
            let small = try await client.send(Fixture.request(.get, "/echo"), context: Self.context())
            #expect(!small.body.isStreamed)
            #expect(try small.body.isReplayable && TestUpstream.Echo.decode(small.body.bytes).target == "/echo")
            let fits = try await client.send(Fixture.request(.get, "/exact"), context: Self.context())
            #expect(!fits.body.isStreamed)
            if let difference = ByteDifference(fits.body.bytes, expected: exact) { Issue.record("\(difference)") }
            let over = try await client.send(Fixture.request(.get, "/over"), context: Self.context())
            #expect(over.body.isStreamed)
            #expect(try await over.collectedBytes() == exact + [1])
            let head = try await client.send(Fixture.request(.head, "/over"), context: Self.context())
            #expect(!head.body.isStreamed)
            #expect(head.body.bytes.isEmpty)
        }
    }
}
