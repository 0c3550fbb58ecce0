import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// An HTTP/1.1 upstream on 127.0.0.1 that closes kept-alive connections the ways servers do,
/// for the tests of stale connections (issue #45): idle ones on command, without a word (as an
/// nginx reload does: `closeIdle`), or as the next request arrives (`script`). It answers with
/// keep-alive and never says `Connection: close`.
///
/// Each request is answered as the next entry of `script` says, in order of arrival over all
/// connections (`.answer` once the script has run out). An answer's body is `METHOD PATH BODY`.
///
/// HTTP/1.1 only, by nature: stale keep-alive reuse is HTTP/1.1's (HTTP/2 has GOAWAY and refused streams).
public final class ClosingUpstream: Sendable {
    public enum Next: Sendable, Equatable {
        /// 200 with `METHOD PATH BODY`, keep-alive.
        case answer
        /// Reads the request whole, then closes the connection without a byte of a response:
        /// the server may have acted on it.
        case hangUp
        /// Sends a head (declaring 100 bytes) and part of the body, then closes.
        case headThenClose
    }

    /// A request as received: which connection (1, 2, … in order of accepting), method, path, body.
    public struct Request: Sendable, Equatable {
        public var connection: Int
        public var method: String
        public var path: String
        public var body: String
    }

    private struct Open {
        var channel: any Channel
        /// Has answered (or is answering) everything it received.
        var idle: Bool
    }

    private struct State {
        var script: [Next]
        var requests: [Request] = []
        var accepted = 0
        var open: [Int: Open] = [:]
        var port = 0
    }

    private let loopback = LoopbackServer<NIOAsyncChannel<HTTPServerRequestPart, ByteBuffer>>()
    private let state: Mutex<State>

    public init(script: [Next] = []) {
        state = Mutex(State(script: script))
    }

    public var port: Int { state.withLock { $0.port } }
    public var requests: [Request] { state.withLock { $0.requests } }
    /// Connections accepted so far.
    public var accepted: Int { state.withLock { $0.accepted } }

    /// Appends to the script (for requests not yet arrived).
    public func then(_ next: Next...) {
        state.withLock { $0.script.append(contentsOf: next) }
    }

    public func start() async throws {
        let server: LoopbackServer<NIOAsyncChannel<HTTPServerRequestPart, ByteBuffer>>.Server = try await ServerBootstrap(group: TestExecutors.group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(
                        ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes)))
                    return .init(try NIOAsyncChannel<HTTPServerRequestPart, ByteBuffer>(wrappingChannelSynchronously: channel))
                }
            }
        let port = loopback.run(server) { [self] connection in await serve(connection) }
        state.withLock { $0.port = port }
    }

    public func shutdown() async {
        await loopback.shutdown()
    }

    /// Closes every connection that has answered all it received, as a server closing idle
    /// keep-alive connections does (an orderly close: the client's kernel gets a FIN), and
    /// returns once they are closed. Synchronous, so that a test can call it while it holds a
    /// client's event loop: the client's side then has the FIN before its loop can read it.
    /// Returns the client-side ports of the connections closed.
    public func closeIdle() -> [Int] {
        let idle = state.withLock { state in
            let idle = state.open.filter { $0.value.idle }
            for key in idle.keys { state.open[key] = nil }
            return idle.values.map(\.channel)
        }
        var ports: [Int] = []
        for channel in idle {
            if let port = channel.remoteAddress?.port { ports.append(port) }
            Self.close(channel)
        }
        return ports
    }

    /// Closes `channel` and blocks until it is closed (not `wait()`, which NIO refuses on any
    /// event loop's thread: the caller may hold a client's loop).
    private static func close(_ channel: any Channel) {
        let closed = DispatchSemaphore(value: 0)
        channel.close().whenComplete { _ in closed.signal() }
        closed.wait()
    }

    private func serve(_ connection: NIOAsyncChannel<HTTPServerRequestPart, ByteBuffer>) async {
        let id = state.withLock { state in
            state.accepted += 1
            state.open[state.accepted] = Open(channel: connection.channel, idle: true)
            return state.accepted
        }
        defer { _ = state.withLock { $0.open.removeValue(forKey: id) } }
        try? await connection.executeThenClose { inbound, outbound in
            var head: HTTPRequestHead?
            var body = ""
            for try await part in inbound {
                switch part {
                case .head(let received):
                    head = received
                    body = ""
                    state.withLock { $0.open[id]?.idle = false }
                case .body(let buffer):
                    body += String(buffer: buffer)
                case .end:
                    guard let request = head else { continue }
                    head = nil
                    let next = state.withLock { state in
                        state.requests.append(Request(connection: id, method: request.method.rawValue, path: request.uri, body: body))
                        return state.script.isEmpty ? Next.answer : state.script.removeFirst()
                    }
                    switch next {
                    case .answer:
                        let text = "\(request.method.rawValue) \(request.uri) \(body)"
                        // Idle from now: a `closeIdle` after the client has this answer finds it so.
                        state.withLock { $0.open[id]?.idle = true }
                        try await outbound.write(ByteBuffer(string: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                                            + "Content-Length: \(text.utf8.count)\r\n\r\n\(text)"))
                    case .hangUp:
                        return
                    case .headThenClose:
                        try await outbound.write(ByteBuffer(string: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"))
                        return
                    }
                }
            }
        }
    }
}

/// The kernel's view of a TCP connection on 127.0.0.1, from /proc/net/tcp: what a test waits
/// for when it must know a FIN has reached the other side before that side's program reads it.
public enum LoopbackTCP {
    /// `TCP_CLOSE_WAIT`: the peer's FIN has arrived.
    public static let closeWait: UInt8 = 8

    /// The state of the socket bound to `localPort` and connected to `remotePort`; `nil`: none.
    public static func state(localPort: Int, remotePort: Int) -> UInt8? {
        guard let table = readWhole("/proc/net/tcp") else { return nil }
        for line in table.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count > 3, port(fields[1]) == localPort, port(fields[2]) == remotePort else { continue }
            return UInt8(fields[3], radix: 16)
        }
        return nil
    }

    /// Blocks the calling thread until the connection from `localPort` to `remotePort` is in
    /// `state` (polled every millisecond), or throws past `timeout`.
    public static func wait(localPort: Int, remotePort: Int, for state: UInt8, timeout: Duration) throws {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        var seen = Self.state(localPort: localPort, remotePort: remotePort)
        while seen != state {
            guard ContinuousClock.now < deadline else {
                throw Eventually.TimedOut(description: "timed out waiting for 127.0.0.1:\(localPort) → :\(remotePort) "
                                          + "to reach TCP state \(state) (last seen: \(seen.map(String.init) ?? "none"))")
            }
            usleep(1_000)
            seen = Self.state(localPort: localPort, remotePort: remotePort)
        }
    }

    /// A /proc file read to its end: it says its size is 0, and comes a page per read.
    private static func readWhole(_ path: String) -> String? {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            bytes.append(contentsOf: chunk[0..<count])
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// `0100007F:1F90` → 8080.
    private static func port(_ address: Substring) -> Int? {
        address.split(separator: ":").last.flatMap { Int($0, radix: 16) }
    }
}
