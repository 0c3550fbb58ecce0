import NIOCore
import NIOPosix
import Synchronization

/// A loopback upstream that keeps the exact bytes of every request it receives and answers
/// each with the same raw response. No HTTP library parses the requests, so nothing is
/// normalised away: tests see precisely how the gateway framed what it forwarded, and the
/// raw response can be as malformed as a test needs (CR/LF in values, NUL bytes…).
///
/// Requests are split by their own framing (`Content-Length`, or `Transfer-Encoding: chunked`
/// decoded to its last chunk, or no body). Bytes that do not frame a request are kept in
/// `unframedBytes` and the connection is closed.
///
/// HTTP/1.1 only, by nature: its point is the HTTP/1.1 bytes on the wire (HTTP/2: `TestUpstream`).
public final class RecordingUpstream: Sendable {
    /// One request as received.
    public struct Received: Sendable {
        /// Head and body exactly as they arrived on the wire.
        public var raw: [UInt8]
        /// The request line, e.g. `POST /x HTTP/1.1`.
        public var requestLine: String
        public var headers: [(name: String, value: String)]
        /// The body bytes (chunked bodies decoded).
        public var body: [UInt8]

        public func values(_ name: String) -> [String] {
            headers.filter { $0.name.lowercased() == name.lowercased() }.map(\.value)
        }
    }

    /// `200 OK` with a two-byte body.
    public static let ok = Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok".utf8)

    private struct State {
        var response: [UInt8]
        var received: [Received] = []
        var unframed: [UInt8] = []
        var port = 0
    }

    private typealias Connection = NIOAsyncChannel<ByteBuffer, ByteBuffer>

    private let state: Mutex<State>
    private let loopback = LoopbackServer<Connection>()
    /// Requests are small in tests; a connection buffering more than this is cut off.
    private static let maxBufferedBytes = 8 * 1024 * 1024

    /// `response` is written, byte for byte, after every complete request.
    public init(response: [UInt8] = RecordingUpstream.ok) {
        state = Mutex(State(response: response))
    }

    public var port: Int { state.withLock { $0.port } }
    /// Every complete request received so far, in arrival order.
    public var requests: [Received] { state.withLock { $0.received } }
    /// Bytes that did not frame a request (a truncated or malformed one).
    public var unframedBytes: [UInt8] { state.withLock { $0.unframed } }

    public func start() async throws {
        let server: LoopbackServer<Connection>.Server = try await ServerBootstrap(group: TestExecutors.group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture { .init(try Connection(wrappingChannelSynchronously: channel)) }
            }
        let port = loopback.run(server) { [self] connection in await serve(connection) }
        state.withLock { $0.port = port }
    }

    public func shutdown() async {
        await loopback.shutdown()
    }

    private func serve(_ connection: Connection) async {
        try? await connection.executeThenClose { inbound, outbound in
            var buffer: [UInt8] = []
            defer {
                if !buffer.isEmpty { state.withLock { $0.unframed += buffer } }
            }
            for try await chunk in inbound {
                buffer += chunk.readableBytesView
                while true {
                    switch Self.frame(buffer) {
                    case .needMore:
                        if buffer.count > Self.maxBufferedBytes { return }
                    case .invalid:
                        return
                    case .request(let request, let used):
                        buffer.removeFirst(used)
                        let response = state.withLock { state in
                            state.received.append(request)
                            return state.response
                        }
                        try await outbound.write(ByteBuffer(bytes: response))
                        continue
                    }
                    break
                }
            }
        }
    }

    enum Framing {
        case needMore
        case invalid
        case request(Received, used: Int)
    }

    /// Splits one request off the front of `bytes` by its own framing.
    static func frame(_ bytes: [UInt8]) -> Framing {
        guard let headEnd = bytes.firstRange(of: [13, 10, 13, 10]) else { return .needMore }
        var lines = String(decoding: bytes[..<headEnd.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        let requestLine = lines.removeFirst()
        var headers: [(name: String, value: String)] = []
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else { return .invalid }
            headers.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: [" ", "\t"])))
        }
        var request = Received(raw: [], requestLine: requestLine, headers: headers, body: [])
        let bodyStart = headEnd.upperBound
        var end = bodyStart
        if let coding = request.values("transfer-encoding").last {
            guard coding.lowercased() == "chunked" else { return .invalid }
            while true {
                guard let lineEnd = bytes[end...].firstRange(of: [13, 10]) else { return .needMore }
                let sizeText = String(decoding: bytes[end..<lineEnd.lowerBound], as: UTF8.self)
                guard let size = Int(sizeText.split(separator: ";").first ?? "", radix: 16), size >= 0 else { return .invalid }
                end = lineEnd.upperBound
                if size == 0 {
                    // Trailer fields, then the empty line.
                    while true {
                        guard let trailerEnd = bytes[end...].firstRange(of: [13, 10]) else { return .needMore }
                        let empty = trailerEnd.lowerBound == end
                        end = trailerEnd.upperBound
                        if empty { break }
                    }
                    break
                }
                guard bytes.count >= end + size + 2 else { return .needMore }
                request.body += bytes[end..<end + size]
                end += size + 2
            }
        } else if let lengthText = request.values("content-length").first {
            guard request.values("content-length").count == 1, let length = Int(lengthText), length >= 0 else { return .invalid }
            guard bytes.count >= bodyStart + length else { return .needMore }
            request.body = Array(bytes[bodyStart..<bodyStart + length])
            end = bodyStart + length
        }
        request.raw = Array(bytes[..<end])
        return .request(request, used: end)
    }
}
