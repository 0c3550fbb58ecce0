import Foundation
import MicroHTTPD
import PorticoTesting
import Synchronization
import Testing

/// A response body the test feeds piece by piece.
final class FedSource: ResponseBodySource {
    private struct State {
        var chunks: [[UInt8]] = []
        var ended = false
        var failed = false
        var wake: (@Sendable () -> Void)?
        var closed: Bool?
        var pendingReads = 0
    }

    private let state = Mutex(State())

    func feed(_ text: String) { change { $0.chunks.append(Array(text.utf8)) } }
    func end() { change { $0.ended = true } }
    func fail() { change { $0.failed = true } }

    /// `nil` while open; then whether the body was delivered whole.
    var closed: Bool? { state.withLock { $0.closed } }
    /// Reads that found nothing (the connection was suspended).
    var pendingReads: Int { state.withLock { $0.pendingReads } }

    private func change(_ body: (inout State) -> Void) {
        let wake = state.withLock { state -> (@Sendable () -> Void)? in
            body(&state)
            defer { state.wake = nil }
            return state.wake
        }
        wake?()
    }

    func read(into buffer: UnsafeMutableRawBufferPointer, wake: @escaping @Sendable () -> Void) -> ResponseBodyRead {
        state.withLock { state in
            if !state.chunks.isEmpty {
                let chunk = state.chunks.removeFirst()
                let count = min(chunk.count, buffer.count)
                chunk.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: count) }
                if count < chunk.count { state.chunks.insert(Array(chunk[count...]), at: 0) }
                return .bytes(count)
            }
            if state.failed { return .failed }
            if state.ended { return .end }
            state.wake = wake
            state.pendingReads += 1
            return .pending
        }
    }

    func close(delivered: Bool) {
        state.withLock { state in
            precondition(state.closed == nil, "closed twice")
            state.closed = delivered
        }
    }
}

/// An upload sink that takes `capacity` bytes, then reports full until `drain`.
final class MeteredSink: RequestBodySink {
    private struct State {
        var received = 0
        var sinceDrain = 0
        var parked = false
        var resume: (@Sendable () -> Void)?
        var finished = false
        var failure: UploadFailure?
        var unlimited = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let capacity: Int
    private let state = Mutex(State())

    init(capacity: Int = 256 * 1024) {
        self.capacity = capacity
    }

    var received: Int { state.withLock { $0.received } }
    var parked: Bool { state.withLock { $0.parked } }
    var failure: UploadFailure? { state.withLock { $0.failure } }

    /// Takes everything from now on, and wakes a parked connection.
    func openUp() {
        let resume = state.withLock { state -> (@Sendable () -> Void)? in
            state.unlimited = true
            state.parked = false
            defer { state.resume = nil }
            return state.resume
        }
        resume?()
    }

    /// Waits for the body's end (or failure).
    func ended() async {
        await withCheckedContinuation { continuation in
            let done = state.withLock { state -> Bool in
                if state.finished || state.failure != nil { return true }
                state.waiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }

    func write(_ bytes: UnsafeRawBufferPointer, resume: @escaping @Sendable () -> Void) -> RequestBodyWrite {
        state.withLock { state in
            state.received += bytes.count
            state.sinceDrain += bytes.count
            guard !state.unlimited, state.sinceDrain >= capacity else { return .accepted }
            state.parked = true
            state.resume = resume
            return .full
        }
    }

    func finish() { end { $0.finished = true } }
    func fail(_ reason: UploadFailure) { end { $0.failure = reason } }

    private func end(_ change: (inout State) -> Void) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            change(&state)
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

@Suite("MicroHTTPD: streamed bodies")
struct StreamingTests {
    @Test("a streamed response reaches the client chunk by chunk, then ends with its terminating chunk")
    func chunkByChunk() async throws {
        let source = FedSource()
        try await withServer(answering: { _ in
            .later { ServerResponse(status: 200, headers: [("Content-Type", "text/event-stream")], payload: .stream(source, length: nil)) }
        }) { server in
            let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(30))
            try await connection.send("GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            source.feed("data: one\n\n")
            #expect(try await connection.receive("data: one"))
            // The connection waits, suspended, for the next event (no busy loop: one read found nothing).
            #expect(await eventually { source.pendingReads >= 1 })
            #expect(server.activeStreams == 1)
            source.feed("data: two\n\n")
            #expect(try await connection.receive("data: two"))
            source.end()
            let response = try #require(try await connection.readResponse())
            #expect(response.header("Transfer-Encoding") == "chunked")
            #expect(response.bodyText == "data: one\n\ndata: two\n\n")
            #expect(await eventually { source.closed == true })
            #expect(await eventually { server.activeStreams == 0 })
            // Keep-alive: the connection serves the next request.
            let next = FedSource()
            _ = next
        }
    }

    @Test("a stream with a declared length is sent with Content-Length")
    func knownLength() async throws {
        let source = FedSource()
        try await withServer(answering: { _ in
            .later { ServerResponse(status: 200, payload: .stream(source, length: 6)) }
        }) { server in
            let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(30))
            try await connection.send("GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
            source.feed("abc")
            #expect(try await connection.receive("abc"))
            source.feed("def")
            source.end()
            let response = try #require(try await connection.readResponse())
            #expect(response.header("Content-Length") == "6")
            #expect(response.bodyText == "abcdef")
            #expect(await eventually { source.closed == true })
        }
    }

    @Test("a failure mid-stream closes the connection short of its framing", arguments: [false, true])
    func failureMidStream(declared: Bool) async throws {
        let source = FedSource()
        try await withServer(answering: { _ in
            .later { ServerResponse(status: 200, payload: .stream(source, length: declared ? 100 : nil)) }
        }) { server in
            let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(30))
            try await connection.send("GET /file HTTP/1.1\r\nHost: x\r\n\r\n")
            source.feed("partial")
            #expect(try await connection.receive("partial"))
            source.fail()
            let rest = String(decoding: try await connection.readToEnd(), as: UTF8.self)
            #expect(rest.hasSuffix("partial") || rest.hasSuffix("partial\r\n"))
            #expect(!rest.contains("\r\n0\r\n\r\n"))
            #expect(await eventually { source.closed == false })
        }
    }

    @Test("a client leaving a waiting stream is noticed: the source is closed and the stream ends", arguments: [false, true])
    func clientLeaves(reset: Bool) async throws {
        let source = FedSource()
        try await withServer(answering: { _ in
            .later { ServerResponse(status: 200, payload: .stream(source, length: nil)) }
        }) { server in
            let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(30))
            try await connection.send("GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            source.feed("first")
            #expect(try await connection.receive("first"))
            #expect(await eventually { source.pendingReads >= 1 })
            if reset { connection.reset() } else { connection.shutdownWrite() }
            #expect(await eventually(timeout: .seconds(10)) { source.closed == false })
            #expect(await eventually(timeout: .seconds(10)) { server.activeStreams == 0 })
            #expect(await eventually(timeout: .seconds(10)) { server.openConnections == 0 })
        }
    }

    @Test("stop ends a waiting stream short of its framing instead of hanging")
    func stopEndsStreams() async throws {
        let source = FedSource()
        var configuration = ServerConfiguration()
        configuration.requestTimeout = .seconds(120)
        let server = HTTPServer(configuration: configuration) { _ in
            .later { ServerResponse(status: 200, payload: .stream(source, length: nil)) }
        }
        try server.start()
        let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(30))
        try await connection.send("GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        source.feed("first")
        #expect(try await connection.receive("first"))
        await server.stop(grace: .milliseconds(300))
        #expect(source.closed == false)
        let rest = String(decoding: try await connection.readToEnd(), as: UTF8.self)
        #expect(!rest.contains("\r\n0\r\n\r\n"))
    }

    @Test("a large or chunked upload is handed over at its head and streamed into the handler's sink",
          arguments: [true, false])
    func streamedUpload(chunked: Bool) async throws {
        let sink = MeteredSink(capacity: .max)
        let seen = Mutex<ServerRequest.StreamedBody?>(nil)
        try await withServer({ $0.bufferedBodyBytes = 1024 }, answering: { request in
            seen.withLock { $0 = request.streamedBody }
            return .later({
                await sink.ended()
                return ServerResponse(status: 200, body: Array("got \(sink.received)\n".utf8))
            }, upload: sink)
        }) { server in
            let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(30))
            let body = [UInt8](repeating: 0x61, count: 100_000)
            if chunked {
                try await connection.send("POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
                for _ in 0..<10 {
                    try await connection.send(Array("2710\r\n".utf8) + body[0..<10_000] + Array("\r\n".utf8))
                }
                try await connection.send("0\r\n\r\n")
            } else {
                try await connection.send("POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\n\r\n")
                try await connection.send(body)
            }
            let response = try #require(try await connection.readResponse())
            #expect(response.bodyText == "got 100000\n")
            #expect(seen.withLock { $0 } == ServerRequest.StreamedBody(length: chunked ? nil : 100_000))
        }
    }

    @Test("an upload faster than its sink parks the connection: the server reads no further until the sink drains")
    func uploadBackpressure() async throws {
        let sink = MeteredSink(capacity: 256 * 1024)
        try await withServer({
            $0.bufferedBodyBytes = 1024
            $0.maxBodyBytes = 64 * 1024 * 1024
        }, answering: { _ in
            .later({
                await sink.ended()
                return ServerResponse(status: 200, body: Array("got \(sink.received)\n".utf8))
            }, upload: sink)
        }) { server in
            let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(60))
            let total = 32 * 1024 * 1024
            try await connection.send("POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: \(total)\r\n\r\n")
            let sender = Task {
                let piece = [UInt8](repeating: 0x62, count: 1024 * 1024)
                for _ in 0..<32 { try await connection.send(piece) }
            }
            #expect(await eventually { sink.parked })
            // Parked: what the server took stays near the sink's capacity (one read beyond it),
            // however much the client has ready; kernel buffers hold the rest.
            let whileParked = sink.received
            #expect(whileParked < 1024 * 1024)
            sink.openUp()
            try await sender.value
            let response = try #require(try await connection.readResponse())
            #expect(response.bodyText == "got \(total)\n")
        }
    }

    @Test("a streamed upload that crosses max_body_bytes is cut: the sink fails and the connection closes")
    func uploadTooLarge() async throws {
        let sink = MeteredSink(capacity: .max)
        try await withServer({
            $0.bufferedBodyBytes = 1024
            $0.maxBodyBytes = 50_000
        }, answering: { _ in
            .later({
                await sink.ended()
                return ServerResponse(status: 200, body: Array("unexpected\n".utf8))
            }, upload: sink)
        }) { server in
            let connection = try RawHTTPConnection(port: Int(server.port), timeout: .seconds(30))
            try await connection.send("POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            let piece = Array("4000\r\n".utf8) + [UInt8](repeating: 0x63, count: 0x4000) + Array("\r\n".utf8)
            for _ in 0..<4 { try? await connection.send(piece) }
            #expect(await eventually { sink.failure == .tooLarge(limit: 50_000) })
            #expect(try await connection.readToEnd().isEmpty)
            #expect(await eventually { server.inFlightRequests == 0 })
        }
    }
}
