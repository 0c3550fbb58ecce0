import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A client that reads a response body piece by piece, for streaming tests: SSE events one at a
/// time, a slow reader (small receive buffer, reads only when told), a client that leaves
/// mid-body, and whether a body ended with its framing (terminating chunk, `Content-Length`
/// reached) or short of it. Blocking socket calls run on threads of their own, as in
/// `RawHTTPConnection`.
public final class StreamingClient: @unchecked Sendable {
    // @unchecked: every mutable property is touched only under `lock`, one operation at a time.
    private var fd: Int32
    private let lock = NSLock()
    /// Bytes received and not yet decoded.
    private var raw: [UInt8] = []
    private var framing: Framing = .unknown
    /// Decoded body bytes read so far.
    public private(set) var bodyBytes = 0
    public private(set) var head: RawHTTPResponse?

    public typealias Failure = RawHTTPConnection.Failure

    private enum Framing {
        case unknown
        case length(remaining: Int)
        /// In a chunk with `remaining` bytes left (0: at a chunk-size line).
        case chunked(remaining: Int)
        case close
        case ended
    }

    /// How a body ended.
    public enum Ending: Sendable, Equatable {
        /// Its framing completed: `Content-Length` reached, or the terminating chunk (or a
        /// close-delimited body's close).
        case complete
        /// The connection closed (or was reset) short of the framing.
        case closedShort
    }

    /// `receiveBuffer`: SO_RCVBUF set before connecting (a slow reader's window stays small).
    public init(port: Int, receiveBuffer: Int? = nil, timeout: Duration = .seconds(60)) throws {
        fd = try LoopbackSocket.connect(host: "127.0.0.1", port: port, timeout: timeout, receiveBuffer: receiveBuffer)
    }

    deinit {
        if fd >= 0 { Glibc.close(fd) }
    }

    private func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await onOwnThread(holding: lock, body)
    }

    /// Sends a GET for `target` (keep-alive not requested: one exchange per client).
    public func get(_ target: String, headers: [(String, String)] = []) async throws {
        let extra = headers.map { "\($0.0): \($0.1)\r\n" }.joined()
        try await send(Array("GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n\(extra)Connection: close\r\n\r\n".utf8))
    }

    public func send(_ bytes: [UInt8]) async throws {
        try await run { [self] in try LoopbackSocket.sendAll(bytes, on: fd) }
    }

    /// Reads the response head (status and headers; `body` empty). Throws if the connection
    /// closes first.
    @discardableResult
    public func readHead() async throws -> RawHTTPResponse {
        try await run { [self] in
            while true {
                if let end = raw.firstRange(of: [13, 10, 13, 10]),
                   let (response, _) = RawHTTPResponse.parse(Array(raw[..<end.upperBound]), forHead: true) {
                    raw.removeFirst(end.upperBound)
                    head = response
                    if response.header("transfer-encoding")?.lowercased().contains("chunked") == true {
                        framing = .chunked(remaining: 0)
                    } else if let length = response.header("content-length").flatMap(Int.init) {
                        framing = length == 0 ? .ended : .length(remaining: length)
                    } else {
                        framing = .close
                    }
                    return response
                }
                guard try fill(upTo: 65536) > 0 else {
                    throw Failure(description: "connection closed before a response head (\(raw.count) bytes)")
                }
            }
        }
    }

    /// Reads decoded body bytes until `marker` has appeared in what this call read; returns the
    /// bytes read. Throws if the body ends first.
    public func readBody(until marker: String) async throws -> [UInt8] {
        let needle = Array(marker.utf8)
        return try await run { [self] in
            var collected: [UInt8] = []
            while collected.firstRange(of: needle) == nil {
                guard let piece = try decode(max: 65536) else {
                    throw Failure(description: "body ended before \"\(marker)\"; got \"\(String(decoding: collected, as: UTF8.self))\"")
                }
                collected += piece
            }
            return collected
        }
    }

    /// Reads up to `count` decoded body bytes and returns them (fewer only when the body ended).
    public func readBody(count: Int) async throws -> [UInt8] {
        try await run { [self] in
            var collected: [UInt8] = []
            while collected.count < count {
                guard let piece = try decode(max: min(65536, count - collected.count)) else { break }
                collected += piece
            }
            return collected
        }
    }

    /// Reads up to `count` decoded body bytes and discards them (a slow reader's sip); returns
    /// how many it read (fewer only when the body ended).
    @discardableResult
    public func readBody(discarding count: Int) async throws -> Int {
        try await run { [self] in
            var total = 0
            while total < count {
                guard let piece = try decode(max: min(65536, count - total)) else { break }
                total += piece.count
            }
            return total
        }
    }

    /// Reads (and discards) the rest of the body; how it ended.
    public func readBodyToEnd() async throws -> Ending {
        try await run { [self] in
            while try decode(max: 1 << 20) != nil {}
            if case .ended = framing { return .complete }
            return .closedShort
        }
    }

    /// Closes with a reset (SO_LINGER 0), as a client that gives up abruptly does.
    public func reset() {
        lock.lock()
        defer { lock.unlock() }
        guard fd >= 0 else { return }
        closeWithReset(fd)
        fd = -1
    }

    /// Closes in the ordinary way (FIN), with unread data possibly left (then the kernel resets).
    public func close() {
        lock.lock()
        defer { lock.unlock() }
        guard fd >= 0 else { return }
        Glibc.close(fd)
        fd = -1
    }

    // MARK: Decoding (under `lock`)

    /// The next decoded body bytes (at most `max`), or nil once the body has ended — properly
    /// (`framing` is `.ended`) or by the connection closing short of it (`framing` unchanged).
    private func decode(max: Int) throws -> [UInt8]? {
        while true {
            switch framing {
            case .unknown:
                throw Failure(description: "readHead first")
            case .ended:
                return nil
            case .close:
                if raw.isEmpty, try fill(upTo: max) == 0 {
                    framing = .ended
                    return nil
                }
                return take(Swift.min(max, raw.count))
            case .length(let remaining):
                if raw.isEmpty, try fill(upTo: Swift.min(max, remaining)) == 0 { return nil }
                let piece = take(Swift.min(max, remaining, raw.count))
                framing = remaining == piece.count ? .ended : .length(remaining: remaining - piece.count)
                return piece
            case .chunked(let remaining) where remaining > 0:
                if raw.isEmpty, try fill(upTo: Swift.min(max, remaining) + 2) == 0 { return nil }
                let piece = take(Swift.min(max, remaining, raw.count))
                framing = .chunked(remaining: remaining - piece.count)
                if remaining == piece.count {
                    // The CRLF after the chunk's data.
                    while raw.count < 2 { if try fill(upTo: 65536) == 0 { return piece.isEmpty ? nil : piece } }
                    raw.removeFirst(2)
                }
                return piece
            case .chunked:
                guard let lineEnd = raw.firstRange(of: [13, 10]) else {
                    if try fill(upTo: 65536) == 0 { return nil }
                    continue
                }
                let line = String(decoding: raw[..<lineEnd.lowerBound], as: UTF8.self)
                guard let size = Int(line.split(separator: ";").first ?? "", radix: 16) else {
                    throw Failure(description: "bad chunk size line \"\(line)\"")
                }
                if size == 0 {
                    // Trailers (none expected) end with an empty line.
                    guard let end = raw[lineEnd.upperBound...].firstRange(of: [13, 10]) else {
                        if try fill(upTo: 65536) == 0 { return nil }
                        continue
                    }
                    raw.removeFirst(end.upperBound)
                    framing = .ended
                    return nil
                }
                raw.removeFirst(lineEnd.upperBound)
                framing = .chunked(remaining: size)
            }
        }
    }

    private func take(_ count: Int) -> [UInt8] {
        let piece = Array(raw[..<count])
        raw.removeFirst(count)
        bodyBytes += count
        return piece
    }

    /// One read of at most `limit` bytes into `raw`; 0 at end of input or reset.
    private func fill(upTo limit: Int) throws -> Int {
        var chunk = [UInt8](repeating: 0, count: Swift.max(1, Swift.min(limit, 1 << 20)))
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == ECONNRESET { return 0 }
            throw Failure(description: "read: \(String(cString: strerror(errno)))")
        }
        raw.append(contentsOf: chunk[..<n])
        return n
    }
}
