import Foundation
import PorticoTesting
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// HTTP/2 to upstreams (issue #45) against nginx, which Portico did not write: cleartext prior
/// knowledge (`listen … http2`) and TLS with ALPN (`listen … ssl http2`). nginx's access log
/// names each request's connection (`$connection`) and protocol, so the tests count connections
/// from the server's side.
@Suite("HTTP/2 upstreams against nginx (issue #45)", .serialized,
       .enabled(if: ExternalServer.available("nginx"), "needs nginx (scripts/test installs it)"))
struct HTTP2UpstreamTests {
    static let logFormat = "log_format h2 '$connection $server_protocol $status $request_method $uri $request_length';"

    /// nginx's access log: (connection, protocol, status, method, path) per line.
    static func accessLog(_ nginx: ExternalServer) -> [(connection: String, proto: String, status: Int, path: String)] {
        let text = (try? String(contentsOf: nginx.directory.appendingPathComponent("access.log"), encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { line in
            let fields = line.split(separator: " ").map(String.init)
            guard fields.count >= 5, let status = Int(fields[2]) else { return nil }
            return (fields[0], fields[1], status, fields[4])
        }
    }

    static func portico(_ upstream: String) async throws -> ProxyProcess {
        try await ProxyProcess.portico(yaml: """
            listen: { address: 127.0.0.1, port: 0, threads: 2 }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: info, format: logfmt }
            upstreams:
              nginx: { \(upstream), transport: nio, timeout: 60s, connect_timeout: 30s }
            routes:
              - { name: all, match: { path_prefix: / }, upstream: nginx }
            """)
    }

    static func tlsBlock(_ certificates: TestCertificates) -> String {
        "ssl_certificate \(certificates.server.certificateFile); ssl_certificate_key \(certificates.server.keyFile);"
    }

    /// One request on a new connection to Portico.
    static func request(_ portico: ProxyProcess, _ target: String, method: String = "GET",
                        body: [UInt8] = []) async throws -> RawHTTPResponse {
        let connection = try RawHTTPConnection(port: portico.port, timeout: .seconds(120))
        var head = "\(method) \(target) HTTP/1.1\r\nHost: gateway.test\r\n"
        if method == "POST" { head += "Content-Length: \(body.count)\r\n" }
        try await connection.send(Array((head + "\r\n").utf8) + body)
        guard let response = try await connection.readResponse() else {
            throw NoAnswer(request: "\(method) \(target)")
        }
        return response
    }

    final class FirstFailure: Sendable {
        let text = Mutex<String?>(nil)
    }

    struct NoAnswer: Error {
        var request: String
    }

    /// The bodies nginx serves, from an HTTP/1.1 upstream of its own behind `proxy_pass` with
    /// `proxy_buffering off` (nginx's workers run as another user and cannot write temporary
    /// files, nor read files, under scripts/test's private TMPDIR). `POST /upload` answers with
    /// the body it read. Shut down by the caller.
    static func origin(_ bodies: [String: [UInt8]]) async throws -> TestUpstream {
        let origin = TestUpstream { request in
            if request.method == "POST" { return .init(status: 200, headers: [("Content-Type", "application/octet-stream")], body: request.body) }
            guard let body = bodies[request.path] else { return .text("not found\n", status: 404) }
            return .init(status: 200, headers: [("Content-Type", "application/octet-stream")], body: body)
        }
        try await origin.start()
        return origin
    }

    /// nginx's location for `origin`, at `rate` per stream (nil: unlimited).
    static func proxied(_ origin: TestUpstream, rate: String? = nil) -> String {
        "location / { proxy_pass http://127.0.0.1:\(origin.port); proxy_buffering off; proxy_request_buffering off; \(rate.map { "limit_rate \($0);" } ?? "") }"
    }

    /// 64 requests at once, each on its own client connection; `true` per body equal to `expected`.
    static func concurrent(_ portico: ProxyProcess, _ count: Int = 64, target: String, expected: [UInt8]) async throws -> [Bool] {
        try await withThrowingTaskGroup(of: Bool.self) { group in
            for _ in 0..<count {
                group.addTask {
                    let response = try await Self.request(portico, target)
                    return response.status == 200 && response.body == expected
                }
            }
            return try await group.reduce(into: [Bool]()) { $0.append($1) }
        }
    }

    @Test("64 concurrent requests over cleartext HTTP/2 share at most connections_per_loop × threads connections, bodies byte-exact")
    func multiplexingCleartext() async throws {
        let blob = RandomBytes.make(1 << 20)
        let origin = try await Self.origin(["/blob.bin": blob])
        // limit_rate keeps the streams open long enough to overlap (any overlap will do: no timing is asserted).
        let nginx = try await ExternalServer.nginx(serverBlock: """
            access_log access.log h2;
            \(Self.proxied(origin, rate: "8m"))
            """, listenParameters: "http2", httpBlock: Self.logFormat)
        defer { nginx.stop() }
        let portico = try await Self.portico(#"url: "http://127.0.0.1:\#(nginx.port)", protocol: http2"#)
        defer { portico.stop() }
        let results = try await Self.concurrent(portico, target: "/blob.bin", expected: blob)
        #expect(results.count == 64 && results.allSatisfy { $0 }, "every body byte-exact")
        let log = Self.accessLog(nginx)
        #expect(log.count == 64)
        #expect(log.allSatisfy { $0.proto == "HTTP/2.0" })
        let connections = Set(log.map(\.connection))
        #expect(connections.count <= 2, "connections used: \(connections.count) (connections_per_loop 1 × 2 threads)")
        await origin.shutdown()
    }

    @Test("over TLS, ALPN picks h2: 64 concurrent downloads and a 3 MiB upload byte-exact both ways on at most 2 connections")
    func tlsBothWays() async throws {
        let certificates = try await TestCertificates.shared()
        let blob = RandomBytes.make(2 << 20)
        // The upload goes through nginx to the origin, which answers with the body it read.
        let echo = try await Self.origin(["/blob.bin": blob])
        let nginx = try await ExternalServer.nginx(serverBlock: """
            \(Self.tlsBlock(certificates))
            access_log access.log h2;
            client_max_body_size 64m;
            \(Self.proxied(echo))
            """, listenParameters: "ssl http2", httpBlock: Self.logFormat)
        defer { nginx.stop() }
        let portico = try await Self.portico(
            #"url: "https://127.0.0.1:\#(nginx.port)", protocol: http2, tls: { ca_file: "\#(certificates.ca.certificateFile)" }"#)
        defer { portico.stop() }
        let results = try await Self.concurrent(portico, target: "/blob.bin", expected: blob)
        #expect(results.count == 64 && results.allSatisfy { $0 }, "every body byte-exact")
        let upload = RandomBytes.make(3 << 20)
        let uploaded = try await Self.request(portico, "/upload", method: "POST", body: upload)
        #expect(uploaded.status == 200)
        if let difference = ByteDifference(uploaded.body, expected: upload) { Issue.record("upload: \(difference)") }
        let log = Self.accessLog(nginx)
        #expect(log.count == 65)
        #expect(log.allSatisfy { $0.proto == "HTTP/2.0" })
        #expect(Set(log.map(\.connection)).count <= 2)
        await echo.shutdown()
    }

    @Test("a stream the server resets is a 502 with a JSON body and a request id; the streams beside it are fine")
    func resetStream() async throws {
        let blob = RandomBytes.make(256 << 10)
        let origin = try await Self.origin(["/blob.bin": blob])
        // nginx answers `return 444` on HTTP/2 with RST_STREAM.
        let nginx = try await ExternalServer.nginx(serverBlock: """
            access_log access.log h2;
            \(Self.proxied(origin, rate: "2m"))
            location /reset { return 444; }
            """, listenParameters: "http2", httpBlock: Self.logFormat)
        defer { nginx.stop() }
        let portico = try await Self.portico(#"url: "http://127.0.0.1:\#(nginx.port)", protocol: http2"#)
        defer { portico.stop() }
        async let others = Self.concurrent(portico, 16, target: "/blob.bin", expected: blob)
        let reset = try await Self.request(portico, "/reset")
        #expect(reset.status == 502)
        let json = try JSONSerialization.jsonObject(with: Data(reset.body)) as? [String: String]
        #expect(json?["error"] == "upstream_unavailable")
        #expect(json?["message"]?.contains("reset the stream") == true)
        #expect(json?["request_id"]?.isEmpty == false)
        let fine = try await others
        #expect(fine.count == 16 && fine.allSatisfy { $0 }, "the other streams' bodies arrive whole")
        // And the connection still carries requests.
        #expect(try await Self.request(portico, "/blob.bin").status == 200)
        await origin.shutdown()
    }

    @Test("a client that stops reading slows only its stream; one that leaves resets its stream and the connection carries on")
    func slowAndLeavingClients() async throws {
        let big = RandomBytes.make(16 << 20)
        let small = RandomBytes.make(2 << 20)
        let origin = try await Self.origin(["/big.bin": big, "/small.bin": small])
        let nginx = try await ExternalServer.nginx(serverBlock: """
            access_log access.log h2;
            \(Self.proxied(origin))
            """, listenParameters: "http2", httpBlock: Self.logFormat)
        defer { nginx.stop() }
        // One thread: one event loop, so every request shares one connection.
        let portico = try await ProxyProcess.portico(yaml: """
            listen: { address: 127.0.0.1, port: 0, threads: 1 }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: info, format: logfmt }
            upstreams:
              nginx: { url: "http://127.0.0.1:\(nginx.port)", transport: nio, protocol: http2, timeout: 60s }
            routes:
              - { name: all, match: { path_prefix: / }, upstream: nginx }
            """)
        defer { portico.stop() }
        // The slow client: its head arrives, then it reads nothing while 16 MiB wait upstream.
        let slow = try RawHTTPConnection(port: portico.port, timeout: .seconds(120))
        try await slow.send("GET /big.bin HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        #expect(try await slow.receive("\r\n\r\n"), "the slow client's head")
        // Meanwhile others get whole bodies on the same connection.
        for _ in 0..<3 {
            let response = try await Self.request(portico, "/small.bin")
            #expect(response.status == 200)
            // Compared outside #expect: its failure message would diff 2 MiB arrays.
            let whole = response.body == small
            #expect(whole, "a body of \(response.body.count) bytes, not the \(small.count) sent")
        }
        // The slow client leaves: its stream is reset, and the connection still serves.
        slow.reset()
        let after = try await Self.request(portico, "/small.bin")
        let whole = after.body == small
        #expect(after.status == 200)
        #expect(whole, "a body of \(after.body.count) bytes")
        let log = Self.accessLog(nginx)
        #expect(Set(log.map(\.connection)).count == 1, "one connection throughout: \(log.map(\.connection))")
        #expect(log.filter { $0.path == "/small.bin" }.count == 4)
        await origin.shutdown()
    }

    /// An HTTP/2 server that sends its SETTINGS on each connection and then nothing: no answer,
    /// no PING acknowledgement.
    static let silentServer = """
        import socket, sys
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", int(sys.argv[1])))
        server.listen(16)
        held = []
        while True:
            connection, _ = server.accept()
            held.append(connection)
            connection.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
        """

    @Test("an upstream that stops answering PING is closed after ping_timeout: a 502, long before the request's timeout")
    func pingTimeout() async throws {
        let silent = try await ExternalServer.python(script: Self.silentServer)
        defer { silent.stop() }
        let portico = try await Self.portico(
            #"url: "http://127.0.0.1:\#(silent.port)", protocol: http2, http2: { ping_interval: 1s, ping_timeout: 1s }"#)
        defer { portico.stop() }
        // The route's timeout is 60 s (a 504 then): a 502 says the dead connection was found by PING.
        let response = try await Self.request(portico, "/x")
        #expect(response.status == 502, "\(response.bodyText)")
        let json = try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: String]
        #expect(json?["error"] == "upstream_unavailable")
    }

    @Test("auto falls back to HTTP/1.1 when ALPN does not pick h2; http2 then answers 502 upstream_protocol_error")
    func alpnFallback() async throws {
        let certificates = try await TestCertificates.shared()
        let nginx = try await ExternalServer.nginx(serverBlock: """
            \(Self.tlsBlock(certificates))
            access_log access.log h2;
            location / { return 200 "ok\\n"; }
            """, listenParameters: "ssl", httpBlock: Self.logFormat)
        defer { nginx.stop() }
        let tls = #"tls: { ca_file: "\#(certificates.ca.certificateFile)" }"#
        let auto = try await Self.portico(#"url: "https://127.0.0.1:\#(nginx.port)", protocol: auto, \#(tls)"#)
        defer { auto.stop() }
        for _ in 0..<3 {
            let response = try await Self.request(auto, "/x")
            #expect(response.status == 200)
            #expect(response.bodyText == "ok\n")
        }
        #expect(Self.accessLog(nginx).allSatisfy { $0.proto == "HTTP/1.1" })
        let strict = try await Self.portico(#"url: "https://127.0.0.1:\#(nginx.port)", protocol: http2, \#(tls)"#)
        defer { strict.stop() }
        let refused = try await Self.request(strict, "/x")
        #expect(refused.status == 502)
        let json = try JSONSerialization.jsonObject(with: Data(refused.body)) as? [String: String]
        // OpenSSL's nginx refuses a handshake that offers only h2 (no_application_protocol), others pick no protocol.
        #expect(["upstream_protocol_error", "upstream_tls_error"].contains(json?["error"] ?? ""), "\(refused.bodyText)")
    }

    @Test("two reloads of nginx (GOAWAY) under load over HTTP/2: every request answered 200", .timeLimit(.minutes(10)))
    func goAwayUnderLoad() async throws {
        let nginx = try await ExternalServer.nginx(serverBlock: """
            location / { return 200 "ok\\n"; }
            """, listenParameters: "http2")
        defer { nginx.stop() }
        let master = try #require(Int32(try String(contentsOf: nginx.directory.appendingPathComponent("nginx.pid"), encoding: .utf8)
                                            .trimmingCharacters(in: .whitespacesAndNewlines)))
        let portico = try await Self.portico(#"url: "http://127.0.0.1:\#(nginx.port)", protocol: http2"#)
        defer { portico.stop() }
        let tally = NginxReloadTests.Tally()
        let firstFailure = FirstFailure()
        let load = Task {
            await withTaskGroup(of: Void.self) { group in
                for _ in 0..<16 {
                    group.addTask {
                        var connection: RawHTTPConnection?
                        var sent = 0
                        while sent < 20_000, !tally.stop.load(ordering: .relaxed) {
                            sent += 1
                            do {
                                let client = try connection ?? RawHTTPConnection(port: portico.port, timeout: .seconds(60))
                                connection = client
                                try await client.send("GET /r HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
                                guard let response = try await client.readResponse() else {
                                    tally.record(0)
                                    connection = nil
                                    continue
                                }
                                tally.record(response.status)
                                if response.status != 200 { firstFailure.text.withLock { $0 = $0 ?? response.bodyText } }
                            } catch {
                                tally.record(0)
                                connection = nil
                            }
                        }
                    }
                }
            }
        }
        do {
            try await tally.waitFor(500, "requests before the first reload")
            for reload in 1...2 {
                let before = NginxReloadTests.workers(of: master)
                try #require(!before.isEmpty, "nginx's worker")
                #expect(kill(master, SIGHUP) == 0)
                try await Eventually.wait(timeout: .seconds(120), "reload \(reload): the old worker gone, a new one up") {
                    let now = NginxReloadTests.workers(of: master)
                    return !now.isEmpty && now.isDisjoint(with: before)
                }
                try await tally.waitFor(500, "requests after reload \(reload)")
            }
        } catch {
            tally.stop.store(true, ordering: .relaxed)
            await load.value
            throw error
        }
        tally.stop.store(true, ordering: .relaxed)
        await load.value
        let statuses = tally.statuses.withLock { $0 }
        #expect(statuses.keys.sorted() == [200], "statuses: \(statuses), first failure: \(firstFailure.text.withLock { $0 } ?? "none")")
        let retried = try await portico.metric("portico_upstream_http2_refused_retries_total")
        print("nginx reloads over HTTP/2: \(statuses[200] ?? 0) requests answered 200, \(Int(retried)) refused streams sent again")
    }
}
