import Foundation
import Portico
import PorticoTesting
import Testing

/// WebSocket sessions over a TLS listener, where libmicrohttpd terminates TLS and relays the
/// session's bytes through a socketpair (`UpgradedConnection`): the ends of a session that the
/// relay does not pass on by itself (the client leaving) and the 1001 close frames.
@Suite("WebSocket over a TLS listener", .enabled(if: WebSocketLab.python != nil, "needs Python's websockets (scripts/test installs it)"))
struct WebSocketTLSTests {
    /// `WebSocketTests.start` with a TLS listener; `ca` signed its certificate.
    static func start(idle: String = "1h") async throws -> (upstream: ExternalServer, gateway: TestGateway, ca: String) {
        let certificates = try await TestCertificates.shared()
        let (upstream, gateway) = try await WebSocketTests.start(idle: idle) { config in
            config.listen.tls = ListenTLSConfig(certificatePEM: certificates.server.certificatePEM,
                                                privateKeyPEM: certificates.server.keyPEM)
        }
        return (upstream, gateway, certificates.ca.certificateFile)
    }

    @Test("the echo suite passes: text, binary, 16 MiB each way, fragments, ping/pong, close codes")
    func echo() async throws {
        let (upstream, gateway, ca) = try await Self.start()
        defer { upstream.stop() }
        let result = try await WebSocketLab.client("wss://localhost:\(gateway.port)", "tls-echo", ca)
        // Under load this once took past 120 s: libmicrohttpd 0.9.75 relayed 4 bytes per round
        // (`portico_mhd_widen_tls_relay` gives it 16 KiB each way).
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /echo 4001" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        await gateway.stop()
    }

    @Test("a client that resets its TLS connection: the upstream sees the session close (libmicrohttpd's relay alone never says)")
    func clientReset() async throws {
        let (upstream, gateway, ca) = try await Self.start()
        defer { upstream.stop() }
        let result = try await WebSocketLab.client("wss://localhost:\(gateway.port)", "reset", nil, ["--ca", ca])
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream, timeout: .seconds(30)) { $0.hasPrefix("closed /echo") } != nil,
                "\(WebSocketLab.events(of: upstream))")
        await gateway.stop()
    }

    @Test("an upstream that drops its connection: the TLS client sees the close at once")
    func upstreamDies() async throws {
        let (upstream, gateway, ca) = try await Self.start()
        defer { upstream.stop() }
        let result = try await WebSocketLab.client("wss://localhost:\(gateway.port)", "upstream-dies", nil, ["--ca", ca])
        #expect(result.status == 0, "\(result.output)")
        await gateway.stop()
    }

    @Test("websocket_idle_timeout over TLS: a close frame 1001 to both sides")
    func idleTimeout() async throws {
        let (upstream, gateway, ca) = try await Self.start(idle: "1s")
        defer { upstream.stop() }
        let result = try await WebSocketLab.client("wss://localhost:\(gateway.port)", "wait-close", "1001", ["--ca", ca])
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /hold 1001" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        await gateway.stop()
    }

    @Test("SIGTERM over TLS: after the grace period each side gets its close frame 1001 (relayed before libmicrohttpd stops)")
    func drain() async throws {
        let upstream = try await WebSocketLab.upstream()
        defer { upstream.stop() }
        let certificates = try await TestCertificates.shared()
        let tls = ", tls: { cert_file: \"\(certificates.server.certificateFile)\", key_file: \"\(certificates.server.keyFile)\" }"
        let proxy = try await ProxyProcess.portico(yaml: WebSocketProcessTests.yaml(upstreamPort: upstream.port, extra: tls))
        defer { proxy.stop() }
        let url = "wss://localhost:\(proxy.port)"
        let client = Task { try await WebSocketLab.client(url, "wait-close", "1001", ["--ca", certificates.ca.certificateFile]) }
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0.hasPrefix("open /hold") } != nil)
        await proxy.terminate()
        let result = try await client.value
        #expect(result.status == 0, "\(result.output)")
        #expect(await WebSocketLab.waitForEvent(of: upstream) { $0 == "closed /hold 1001" } != nil,
                "\(WebSocketLab.events(of: upstream))")
        #expect(proxy.log.contains("ended=drained"), "\(proxy.log)")
    }
}
