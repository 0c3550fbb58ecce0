import Foundation
import NIOCore
import NIOEmbedded
import Synchronization
import Testing
@testable import Portico

/// `UpgradeSession` with both sides on `EmbeddedChannel`s of one embedded loop: the upstream's
/// as the exchange handler leaves it (a `RelayHandler` in its pipeline), the client's made by a
/// `TestClient` where libmicrohttpd's connection would become a channel. Time is a clock whose
/// instants are the embedded loop's (`LoopClock`), moved by hand.
@Suite("Upgrade session")
struct UpgradeSessionTests {
    /// The gateway's clock, kept in step with an embedded loop's time: its deadlines are that
    /// loop's timers, which `advance` runs.
    final class LoopClock: GatewayClock {
        let origin = ContinuousClock.now
        private let offset = Mutex(Duration.zero)

        var now: ContinuousClock.Instant { origin.advanced(by: offset.withLock { $0 }) }
        var wallNow: Date { Date(timeIntervalSince1970: 1_750_000_000) }

        func eventLoopDeadline(for instant: ContinuousClock.Instant) -> NIODeadline? {
            let (seconds, attoseconds) = origin.duration(to: instant).components
            return .uptimeNanoseconds(UInt64(max(0, seconds * 1_000_000_000 + attoseconds / 1_000_000_000)))
        }

        func sleep(until deadline: ContinuousClock.Instant) async throws {
            Issue.record("the session's timers are the loop's on this clock")
            throw CancellationError()
        }

        func advance(by duration: Duration, _ loop: EmbeddedEventLoop) {
            let offset = offset.withLock { offset in
                offset += duration
                return offset
            }
            loop.advanceTime(to: eventLoopDeadline(for: origin.advanced(by: offset)) ?? loop.now)
        }
    }

    /// Where libmicrohttpd's upgraded connection would be: becomes an embedded channel (or fails to).
    /// `@unchecked Sendable`: used only on the test's thread, which is the embedded loop's.
    final class TestClient: UpgradeClientSide, @unchecked Sendable {
        let received: [UInt8]
        private let loop: EmbeddedEventLoop
        private let fails: Bool
        private(set) var channel: EmbeddedChannel?
        private(set) var closedWithChannel = false
        private(set) var givenBack = false

        init(received: String = "", loop: EmbeddedEventLoop, fails: Bool = false) {
            self.received = Array(received.utf8)
            self.loop = loop
            self.fails = fails
        }

        func attach(_ relay: NIOLoopBound<RelayHandler>, on loop: any EventLoop) -> EventLoopFuture<any Channel> {
            guard !fails else { return loop.makeFailedFuture(ChannelError.ioOnClosedChannel) }
            let channel = EmbeddedChannel(loop: self.loop)
            do {
                try channel.pipeline.syncOperations.addHandler(relay.value)
                channel.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 1), promise: nil)
            } catch {
                return loop.makeFailedFuture(error)
            }
            self.channel = channel
            return loop.makeSucceededFuture(channel)
        }

        func channelClosed() { closedWithChannel = true }
        func giveBack() { givenBack = true }
    }

    final class Summaries: Sendable {
        private let all = Mutex<[UpgradeSummary]>([])
        func append(_ summary: UpgradeSummary) { all.withLock { $0.append(summary) } }
        var list: [UpgradeSummary] { all.withLock { $0 } }
    }

    /// One session with its upstream side connected; the client's comes when the test says.
    struct Session {
        let loop = EmbeddedEventLoop()
        let clock = LoopClock()
        let upstream: EmbeddedChannel
        let session: UpgradeSession
        let summaries = Summaries()

        init(idleTimeout: Duration = .seconds(60)) throws {
            upstream = EmbeddedChannel(loop: loop)
            let relay = RelayHandler(side: .upstream)
            try upstream.pipeline.syncOperations.addHandler(relay)
            upstream.connect(to: try SocketAddress(ipAddress: "127.0.0.1", port: 2), promise: nil)
            let summaries = self.summaries
            session = UpgradeSession(tunnel: UpstreamTunnel(channel: upstream, relay: relay), idleTimeout: idleTimeout,
                                     clock: clock) { summaries.append($0) }
        }

        /// The client's side arrives and joins; `nil` if it did not become a channel.
        @discardableResult
        func arrive(_ client: TestClient) -> EmbeddedChannel? {
            session.arrived(client)
            loop.run()
            return client.channel
        }

        func advance(_ duration: Duration) {
            clock.advance(by: duration, loop)
            loop.run()
        }
    }

    /// Everything `channel` wrote so far.
    static func written(_ channel: EmbeddedChannel) throws -> [UInt8] {
        var bytes: [UInt8] = []
        while let buffer = try channel.readOutbound(as: ByteBuffer.self) { bytes += Array(buffer.readableBytesView) }
        return bytes
    }

    static func send(_ bytes: [UInt8], from channel: EmbeddedChannel) throws {
        try channel.writeInbound(ByteBuffer(bytes: bytes))
    }

    /// A client's text frame (masked, with a mask of zeros: the payload reads as itself).
    static func clientFrame(_ text: String) -> [UInt8] {
        [0x81, 0x80 | UInt8(text.utf8.count), 0, 0, 0, 0] + Array(text.utf8)
    }

    static func serverFrame(_ text: String) -> [UInt8] {
        [0x81, UInt8(text.utf8.count)] + Array(text.utf8)
    }

    static let closeToClient: [UInt8] = [0x88, 0x02, 0x03, 0xE9]

    /// A close frame toward the upstream: masked, code 1001.
    static func isCloseToUpstream(_ bytes: ArraySlice<UInt8>) -> Bool {
        let bytes = Array(bytes)
        guard bytes.count == 8, bytes[0] == 0x88, bytes[1] == 0x82 else { return false }
        return [bytes[6] ^ bytes[2], bytes[7] ^ bytes[3]] == [0x03, 0xE9]
    }

    // MARK: Tests

    @Test("the client's bytes read past its handshake go first; then bytes flow both ways")
    func relays() throws {
        let test = try Session()
        let client = try #require(test.arrive(TestClient(received: "early", loop: test.loop)))
        #expect(try Self.written(test.upstream) == Array("early".utf8))
        try Self.send(Self.clientFrame("hi"), from: client)
        #expect(try Self.written(test.upstream) == Self.clientFrame("hi"))
        try Self.send(Self.serverFrame("yo"), from: test.upstream)
        #expect(try Self.written(client) == Self.serverFrame("yo"))
        #expect(test.summaries.list.isEmpty)
    }

    @Test("quiet both ways for the idle timeout on the gateway's clock: 1001 to both sides, then both closed and reported")
    func idleTimeout() throws {
        let test = try Session()
        let connection = TestClient(loop: test.loop)
        let client = try #require(test.arrive(connection))
        test.advance(.seconds(30))
        try Self.send(Self.clientFrame("hi"), from: client)
        _ = try Self.written(test.upstream)
        test.advance(.seconds(30))
        #expect(client.isActive, "bytes 30 s ago: not idle yet")
        test.advance(.seconds(29))
        #expect(client.isActive)
        test.advance(.seconds(1))
        #expect(try Self.written(client) == Self.closeToClient)
        #expect(Self.isCloseToUpstream(try Self.written(test.upstream)[...]))
        #expect(!client.isActive && !test.upstream.isActive)
        #expect(connection.closedWithChannel)
        let summary = try #require(test.summaries.list.first)
        #expect(test.summaries.list.count == 1)
        #expect(summary.reason == .idleTimeout)
        #expect(summary.duration == .seconds(90), "from the client's arrival, on the gateway's clock")
        #expect(summary.bytesFromClient == Self.clientFrame("hi").count && summary.bytesFromUpstream == 0)
    }

    @Test("the upstream closing closes the client's side at once, without a close frame")
    func upstreamCloses() throws {
        let test = try Session()
        let connection = TestClient(loop: test.loop)
        let client = try #require(test.arrive(connection))
        try test.upstream.close().wait()
        test.loop.run()
        #expect(try Self.written(client).isEmpty)
        #expect(!client.isActive && connection.closedWithChannel)
        #expect(test.summaries.list.map(\.reason) == [.upstreamClosed])
    }

    @Test("the server stopping lets a frame in progress finish (nothing after it), then says 1001 both ways")
    func drainMidFrame() throws {
        let test = try Session()
        let client = try #require(test.arrive(TestClient(loop: test.loop)))
        let frame = Self.clientFrame("0123456789")
        try Self.send(Array(frame[..<4]), from: client)
        test.session.serverStopping()
        test.loop.run()
        #expect(client.isActive, "waiting for the frame's end")
        try Self.send(Array(frame[4...]) + Self.clientFrame("dropped"), from: client)
        let upstreamGot = try Self.written(test.upstream)
        #expect(Array(upstreamGot.prefix(frame.count)) == frame)
        #expect(Self.isCloseToUpstream(upstreamGot.dropFirst(frame.count)), "the close frame right after the frame, nothing else")
        #expect(try Self.written(client) == Self.closeToClient)
        test.loop.run()
        #expect(test.summaries.list.map(\.reason) == [.drained])
    }

    @Test("a frame still unfinished when the finish limit passes: that side gets no close frame")
    func drainLimit() throws {
        let test = try Session()
        let client = try #require(test.arrive(TestClient(loop: test.loop)))
        try Self.send(Array(Self.clientFrame("0123456789")[..<4]), from: client)
        _ = try Self.written(test.upstream)
        test.session.serverStopping()
        test.loop.run()
        test.advance(.seconds(9))
        #expect(client.isActive)
        test.advance(.seconds(1))
        #expect(try Self.written(test.upstream).isEmpty, "no close frame into the middle of a frame")
        #expect(try Self.written(client) == Self.closeToClient)
        #expect(!client.isActive && !test.upstream.isActive)
        #expect(test.summaries.list.map(\.duration) == [.seconds(10)])
    }

    @Test("a session ended before the client's side came closes the upstream, and gives that side back when it comes")
    func endedBeforeClient() throws {
        let test = try Session()
        test.session.serverStopping()
        test.loop.run()
        #expect(!test.upstream.isActive)
        #expect(test.summaries.list.map(\.reason) == [.drained])
        let late = TestClient(loop: test.loop)
        #expect(test.arrive(late) == nil)
        #expect(late.givenBack)
    }

    @Test("a client's side that cannot become a channel is given back, and the upstream closed")
    func attachFails() throws {
        let test = try Session()
        let connection = TestClient(loop: test.loop, fails: true)
        test.arrive(connection)
        #expect(connection.givenBack)
        #expect(!test.upstream.isActive, "the upstream's connection must not wait for a client that will not come")
        #expect(test.summaries.list.map(\.reason) == [.clientClosed])
    }
}
