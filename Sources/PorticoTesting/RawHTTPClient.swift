import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A raw TCP client for tests that must control every byte (pipelining, malformed requests,
/// half-sent heads). Each blocking socket call runs on a thread of its own — never on the Swift
/// concurrency pool and never on libdispatch's workers, which FoundationNetworking's URLSession
/// needs: hundreds of blocked reads there would starve the gateway's upstream calls.
public final class RawHTTPConnection: @unchecked Sendable {
    // @unchecked: `fd` and `buffer` are only touched under `lock`, one operation at a time.
    private var fd: Int32
    private var buffer: [UInt8] = []
    private let lock = NSLock()

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public init(host: String = "127.0.0.1", port: Int, timeout: Duration = .seconds(60)) throws {
        fd = try LoopbackSocket.connect(host: host, port: port, timeout: timeout)
    }

    deinit {
        if fd >= 0 { close(fd) }
    }

    private func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await onOwnThread(holding: lock, body)
    }

    public func send(_ text: String) async throws {
        try await send(Array(text.utf8))
    }

    public func send(_ bytes: [UInt8]) async throws {
        try await run { [self] in try LoopbackSocket.sendAll(bytes, on: fd) }
    }

    /// Closes the sending side (the server sees end of input).
    public func shutdownWrite() {
        lock.lock()
        _ = Glibc.shutdown(fd, Int32(SHUT_WR))
        lock.unlock()
    }

    /// Closes the connection with a reset (SO_LINGER 0) instead of an orderly close, as a client
    /// that crashes or gives up abruptly does. Later calls fail.
    public func reset() {
        lock.lock()
        defer { lock.unlock() }
        guard fd >= 0 else { return }
        closeWithReset(fd)
        fd = -1
    }

    /// Reads one complete response (Content-Length or chunked framing; HEAD/204/304 have no body).
    /// Returns nil when the server closed the connection before a response began.
    public func readResponse(forHead: Bool = false) async throws -> RawHTTPResponse? {
        try await run { [self] in
            while true {
                if let (response, used) = RawHTTPResponse.parse(buffer, forHead: forHead) {
                    buffer.removeFirst(used)
                    return response
                }
                if try !fill() {
                    if buffer.isEmpty { return nil }
                    throw Failure(description: "connection closed mid-response after \(buffer.count) bytes")
                }
            }
        }
    }

    /// Reads until what was received (and not consumed) contains `text`; false when the server
    /// closed the connection first. Nothing is consumed: streamed bodies are checked piece by piece.
    public func receive(_ text: String) async throws -> Bool {
        let marker = Array(text.utf8)
        return try await run { [self] in
            while true {
                if buffer.count >= marker.count,
                   (0...(buffer.count - marker.count)).contains(where: { buffer[$0..<($0 + marker.count)].elementsEqual(marker) }) {
                    return true
                }
                if try !fill() { return false }
            }
        }
    }

    /// Reads until the server closes the connection; returns everything not yet consumed.
    public func readToEnd() async throws -> [UInt8] {
        try await run { [self] in
            while try fill() {}
            defer { buffer = [] }
            return buffer
        }
    }

    /// Bytes received but not yet consumed by `readResponse` (after a response: whatever followed it).
    public var unconsumedBytes: [UInt8] {
        lock.lock()
        defer { lock.unlock() }
        return buffer
    }

    /// Whether the server has closed the connection (reads end of input within the timeout).
    public func isClosedByPeer() async throws -> Bool {
        try await run { [self] in
            do { return try !fill() } catch { return false }
        }
    }

    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n < 0 {
            if errno == ECONNRESET { return false }
            throw Failure(description: "read: \(String(cString: strerror(errno)))")
        }
        if n == 0 { return false }
        buffer.append(contentsOf: chunk[..<n])
        return true
    }
}

/// A parsed response.
public struct RawHTTPResponse: Sendable {
    public var status: Int
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    public func headers(_ name: String) -> [String] {
        headers.filter { $0.name.lowercased() == name.lowercased() }.map(\.value)
    }

    public var bodyText: String { String(decoding: body, as: UTF8.self) }

    /// Parses one response from the start of `bytes`; nil when more bytes are needed.
    public static func parse(_ bytes: [UInt8], forHead: Bool) -> (RawHTTPResponse, Int)? {
        let separator: [UInt8] = [13, 10, 13, 10]
        guard let headEnd = bytes.firstRange(of: separator) else { return nil }
        let headText = String(decoding: bytes[..<headEnd.lowerBound], as: UTF8.self)
        var lines = headText.components(separatedBy: "\r\n")
        let statusLine = lines.removeFirst().split(separator: " ", maxSplits: 2)
        let status = statusLine.count > 1 ? Int(statusLine[1]) ?? 0 : 0
        let headers = lines.compactMap { line -> (name: String, value: String)? in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        var response = RawHTTPResponse(status: status, headers: headers, body: [])
        let bodyStart = headEnd.upperBound
        if forHead || status == 204 || status == 304 || (100..<200).contains(status) {
            return (response, bodyStart)
        }
        if response.header("transfer-encoding")?.lowercased().contains("chunked") == true {
            var offset = bodyStart
            var body: [UInt8] = []
            while true {
                guard let lineEnd = bytes[offset...].firstRange(of: [13, 10]) else { return nil }
                let sizeText = String(decoding: bytes[offset..<lineEnd.lowerBound], as: UTF8.self)
                guard let size = Int(sizeText.split(separator: ";").first ?? "", radix: 16) else { return nil }
                let dataStart = lineEnd.upperBound
                if size == 0 {
                    guard let end = bytes[dataStart...].firstRange(of: [13, 10]) else { return nil }
                    response.body = body
                    return (response, end.upperBound)
                }
                guard bytes.count >= dataStart + size + 2 else { return nil }
                body.append(contentsOf: bytes[dataStart..<dataStart + size])
                offset = dataStart + size + 2
            }
        }
        let length = Int(response.header("content-length") ?? "0") ?? 0
        guard bytes.count >= bodyStart + length else { return nil }
        response.body = Array(bytes[bodyStart..<bodyStart + length])
        return (response, bodyStart + length)
    }
}

/// Runs blocking socket work on a thread of its own, holding `lock` (one call at a time per
/// socket), and hands its result to the awaiting task: a blocking read never holds up a
/// thread of Swift's cooperative pool.
func onOwnThread<T: Sendable>(holding lock: NSLock, _ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread {
            lock.lock()
            let result = Result { try body() }
            lock.unlock()
            continuation.resume(with: result)
        }
        thread.stackSize = 512 * 1024
        thread.start()
    }
}

/// The blocking socket calls the raw test clients share.
enum LoopbackSocket {
    /// A connected TCP socket with `timeout` on every read and write; `receiveBuffer` sets
    /// SO_RCVBUF before connecting (a slow reader's window stays small).
    static func connect(host: String, port: Int, timeout: Duration, receiveBuffer: Int? = nil) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw RawHTTPConnection.Failure(description: "socket: \(String(cString: strerror(errno)))") }
        var tv = timeval(tv_sec: Int(timeout.components.seconds), tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        if var size = receiveBuffer.map(Int32.init) {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        inet_pton(AF_INET, host, &address.sin_addr)
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let message = String(cString: strerror(errno))
            // Closed here and never handed out: no owner's deinit can close it a second time
            // (a second close could hit a descriptor another thread has opened since).
            close(fd)
            throw RawHTTPConnection.Failure(description: "connect to \(host):\(port): \(message)")
        }
        return fd
    }

    /// Writes all of `bytes`. MSG_NOSIGNAL: a peer that has closed makes this fail with EPIPE
    /// instead of killing the process.
    static func sendAll(_ bytes: [UInt8], on fd: Int32) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { throw RawHTTPConnection.Failure(description: "write: \(String(cString: strerror(errno)))") }
            offset += n
        }
    }
}

/// Closes `fd` with a reset (SO_LINGER 0) instead of an orderly close: the peer sees a
/// connection reset, as from a client that crashes or gives up abruptly.
func closeWithReset(_ fd: Int32) {
    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
    Glibc.close(fd)
}
