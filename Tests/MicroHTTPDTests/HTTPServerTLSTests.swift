import Foundation
import MicroHTTPD
import PorticoTesting
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("MicroHTTPD server: TLS")
struct HTTPServerTLSTests {
    @Test("a certificate or key GnuTLS refuses fails start with a clear error; a good pair serves")
    func refusedKeyMaterial() async throws {
        let certificates = try await TestCertificates.shared()
        var configuration = ServerConfiguration()
        configuration.tls = .init(certificatePEM: Array("-----BEGIN CERTIFICATE-----\nnot base64\n".utf8),
                                  privateKeyPEM: certificates.server.keyPEM)
        let refused = HTTPServer(configuration: configuration) { _ in ServerResponse(status: 200) }
        #expect {
            try refused.start()
        } throws: { error in
            guard case MicroHTTPDError.startFailed(_, _, let detail)? = error as? MicroHTTPDError else { return false }
            return detail.contains("TLS certificate or key")
        }

        configuration.tls = .init(certificatePEM: certificates.server.certificatePEM,
                                  privateKeyPEM: certificates.server.keyPEM)
        let server = HTTPServer(configuration: configuration) { _ in ServerResponse(status: 200) }
        #expect(try server.start() > 0)
        await server.stop(grace: .seconds(1))
    }

    @Test("an upgraded TLS connection relays through 16 KiB buffers each way (libmicrohttpd 0.9.75's were 4 bytes), 1 MiB echoes whole, and the client leaving ends the handler's stream")
    func upgradedTLSRelay() async throws {
        let python = try #require(TestPython.interpreter(importing: "ssl"))
        let certificates = try await TestCertificates.shared()
        var configuration = ServerConfiguration()
        configuration.tls = .init(certificatePEM: certificates.server.certificatePEM, privateKeyPEM: certificates.server.keyPEM)
        let echo = EchoUpgrade()
        let server = HTTPServer(configuration: configuration) { _ in
            ServerResponse(status: 101, headers: [("Connection", "Upgrade"), ("Upgrade", "echo")], payload: .upgrade(echo))
        }
        let port = try server.start()
        let client = #"""
            import os, socket, ssl, sys, threading
            context = ssl.create_default_context(cafile=sys.argv[2])
            s = context.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1]))), server_hostname="localhost")
            s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = s.recv(1)
                if not chunk: sys.exit("closed before the head")
                head += chunk
            if not head.startswith(b"HTTP/1.1 101"): sys.exit("head: %r" % head)
            payload = os.urandom(1 << 20)
            threading.Thread(target=lambda: s.sendall(payload), daemon=True).start()
            back = b""
            while len(back) < len(payload):
                chunk = s.recv(65536)
                if not chunk: break
                back += chunk
            print("ok" if back == payload else "echoed %d bytes, %s" % (len(back), "a prefix" if payload.startswith(back) else "different"))
            """#
        let output = FileManager.default.temporaryDirectory.appendingPathComponent("portico-tls-relay-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: output) }
        let process = try ChildProcess(executable: python, arguments: ["-c", client, String(port), certificates.ca.certificateFile],
                                       standardOutput: .file(output), standardError: .file(output))
        let status = await process.waitForExit(timeout: Duration.seconds(300))
        if status == nil { await process.terminate() }
        let printed = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        #expect(status == 0 && printed.hasPrefix("ok"), "\(printed)")
        // The client has gone: the handler reads the end of its stream (libmicrohttpd 0.9.75 alone
        // would not tell it), closes, and the connection is gone.
        let deadline = ContinuousClock.now + .seconds(60)
        while server.upgradedConnections > 0 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(server.upgradedConnections == 0)
        let relay = echo.relayBytes.withLock { $0 }
        if ["0.9.75", "0.9.76", "0.9.77"].contains(HTTPServer.libraryVersion) {
            #expect(relay == 16 * 1024, "libmicrohttpd \(HTTPServer.libraryVersion)")
        }
        await server.stop(grace: .seconds(5))
    }
}

/// Echoes an upgraded connection's bytes back on a thread of its own (blocking reads through
/// poll, with no timeout: only the end of the stream, or the server stopping, ends it).
private final class EchoUpgrade: ConnectionUpgradeHandler {
    let relayBytes = Mutex<Int?>(nil)
    /// The connection's descriptor while the echo runs (-1 after).
    private let descriptor = Mutex<Int32>(-1)

    func upgraded(_ connection: UpgradedConnection) {
        relayBytes.withLock { $0 = connection.tlsRelayBytes }
        let fd = connection.socket
        descriptor.withLock { $0 = fd }
        let thread = Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 65536)
            loop: while true {
                var readable = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                guard poll(&readable, 1, -1) > 0 else { break }
                let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if count < 0 && (errno == EAGAIN || errno == EINTR) { continue }
                guard count > 0 else { break }
                var sent = 0
                while sent < count {
                    let wrote = buffer.withUnsafeBytes { write(fd, $0.baseAddress! + sent, count - sent) }
                    if wrote > 0 { sent += wrote; continue }
                    guard wrote < 0, errno == EAGAIN || errno == EINTR else { break loop }
                    var writable = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                    guard poll(&writable, 1, -1) > 0 else { break loop }
                }
            }
            descriptor.withLock { fd in
                close(fd)
                fd = -1
            }
            connection.close()
        }
        thread.start()
    }

    func serverStopping() {
        descriptor.withLock { fd in
            if fd >= 0 { _ = shutdown(fd, Int32(SHUT_RDWR)) }
        }
    }

    func abandoned() {}
}
