import Foundation
import Portico
import PorticoTesting
import Testing

/// The smuggling suite's upgrade cases (issue #35), beside `RequestSmugglingTests`: a protocol
/// switch is honoured only where a route opted in, and only when the upstream was asked for it;
/// the bytes a client sends past a refused handshake never reach the upstream.
@Suite("Request smuggling: upgrades")
struct UpgradeSmugglingTests {
    static let handshake = """
        GET /ws/chat HTTP/1.1\r
        Host: gw\r
        Connection: Upgrade\r
        Upgrade: websocket\r
        Sec-WebSocket-Version: 13\r
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r
        \r

        """

    static func gateway(_ upstream: RecordingUpstream) throws -> TestGateway {
        try TestGateway(try ConfigLoader.load(yaml: """
            upstreams:
              up: { url: "http://127.0.0.1:\(upstream.port)", transport: nio }
            routes:
              - { name: ws, match: { path_prefix: /ws/ }, upstream: up, websocket: true, middleware: [] }
              - { name: plain, match: { path_prefix: / }, upstream: up, middleware: [] }
            """, environment: [:]))
    }

    @Test("Upgrade on a route that did not opt in goes up as a plain request, without Upgrade and without the upgrade token")
    func notOptedIn() async throws {
        let upstream = RecordingUpstream()
        try await upstream.start()
        let gateway = try Self.gateway(upstream)
        let connection = try gateway.connect()
        try await connection.send(Self.handshake.replacingOccurrences(of: "/ws/chat", with: "/plain"))
        let response = try #require(try await connection.readResponse())
        #expect(response.status == 200)
        let received = try #require(upstream.requests.first)
        #expect(received.requestLine == "GET /plain HTTP/1.1")
        #expect(received.values("upgrade").isEmpty, "\(String(decoding: received.raw, as: UTF8.self))")
        #expect(!received.values("connection").contains { $0.lowercased().contains("upgrade") })
        // End-to-end fields go up as they came.
        #expect(received.values("sec-websocket-key") == ["dGhlIHNhbXBsZSBub25jZQ=="])
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("on a route that opted in, the handshake goes up with Connection: Upgrade and Upgrade: websocket")
    func optedInForwardsBoth() async throws {
        let upstream = RecordingUpstream(response: Array("HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno".utf8))
        try await upstream.start()
        let gateway = try Self.gateway(upstream)
        let connection = try gateway.connect()
        try await connection.send(Self.handshake)
        let response = try #require(try await connection.readResponse())
        #expect(response.status == 403)
        #expect(response.bodyText == "no")
        let received = try #require(upstream.requests.first)
        #expect(received.values("upgrade") == ["websocket"])
        #expect(received.values("connection") == ["Upgrade"])
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("a 101 from an upstream that was not asked to upgrade is a 502", arguments: ["/plain", "/ws/plain-get"])
    func unaskedSwitch(target: String) async throws {
        let upstream = RecordingUpstream(response: Array(
            "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nraw bytes".utf8))
        try await upstream.start()
        let gateway = try Self.gateway(upstream)
        // A plain GET (no upgrade asked), on a route that did not opt in and on one that did.
        let response = try await gateway.request("GET", target)
        #expect(response.status == 502)
        #expect(!response.bodyText.contains("raw bytes"))
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("bytes a client sends past a handshake the upstream refuses are not relayed")
    func bytesAfterRefusal() async throws {
        let upstream = RecordingUpstream(response: Array("HTTP/1.1 403 Forbidden\r\nContent-Length: 2\r\n\r\nno".utf8))
        try await upstream.start()
        let gateway = try Self.gateway(upstream)
        let connection = try gateway.connect()
        // A masked text frame "hi", and then what would be a second request, in the handshake's write.
        let frame: [UInt8] = [0x81, 0x82, 1, 2, 3, 4, UInt8(ascii: "h") ^ 1, UInt8(ascii: "i") ^ 2]
        let smuggled = Array("GET /plain/smuggled HTTP/1.1\r\nHost: gw\r\n\r\n".utf8)
        try await connection.send(Array(Self.handshake.utf8) + frame + smuggled)
        let response = try #require(try await connection.readResponse())
        #expect(response.status == 403)
        // The frame is no HTTP: the gateway refuses it (or closes), and nothing of it goes up.
        _ = try? await connection.readResponse()
        // Closed: whatever the gateway made of those bytes is done by now.
        #expect(try await connection.isClosedByPeer())
        #expect(upstream.requests.count == 1, "\(upstream.requests.map(\.requestLine))")
        #expect(upstream.unframedBytes.isEmpty, "\(upstream.unframedBytes)")
        await gateway.stop()
        await upstream.shutdown()
    }
}
