import Foundation
import Logging
import Portico
import PorticoTesting
import Testing

/// The upstream tests run on HTTP/1.1 and on HTTP/2 (ALPN `h2`; the upstream offers nothing
/// else), except those of token endpoints (fetched on HTTP/1.1: they have no `protocol`),
/// of urlsession (no HTTP/2) and of the listener (inbound is HTTP/1.1).
@Suite("TLS: HTTPS upstreams, token endpoints and the listener")
struct TLSTests {
    /// The protocols the upstream tests run on.
    static let protocols: [UpstreamProtocol] = [.http1, .http2]

    static func upstream(_ pair: KeyPath<TestCertificates, TestCertificates.Pair>,
                         requireClientCertificate: Bool = false, speaking: UpstreamProtocol = .http1) async throws -> TestUpstream {
        let certificates = try await TestCertificates.shared()
        let upstream = TestUpstream(tls: try certificates.serverTLS(certificates[keyPath: pair],
                                                                     requireClientCertificate: requireClientCertificate),
                                    speaking: speaking == .http1 ? .http1 : .http2)
        try await upstream.start()
        return upstream
    }

    /// A gateway proxying `/api` to `url` over `transport` with `tls`, on `httpProtocol`.
    static func gateway(_ url: URL, transport: UpstreamConfig.Transport = .nio, tls: TLSClientConfig,
                        httpProtocol: UpstreamProtocol = .http1,
                        logger: Logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        throws -> TestGateway {
        var config = PorticoConfig()
        var settings = UpstreamConfig(name: "billing", url: url)
        settings.transport = transport
        settings.httpProtocol = httpProtocol
        settings.tls = tls
        // Debug-built BoringSSL handshakes slowly on a loaded machine: deadlines far above that.
        settings.connectTimeout = .seconds(30)
        settings.timeout = .seconds(60)
        // Pooled connections outlive any pause a loaded machine puts between two requests (the
        // default 4 s did not, once: a handshake on one pair outlasted the other pair's idle
        // connection), so the tests' counts of upstream connections depend on no clock.
        settings.idleTimeout = .seconds(600)
        config.listen.requestTimeout = .seconds(90)
        config.upstreams = ["billing": settings]
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api"), upstream: "billing", stripPrefix: true)]
        return try TestGateway(config, logger: logger)
    }

    static func errorCode(_ response: RawHTTPResponse) throws -> String {
        try JSONDecoder().decode(ErrorBody.self, from: Data(response.body)).error
    }

    /// Every request `upstream` received came on `httpProtocol`.
    static func expectArrivals(_ upstream: TestUpstream, on httpProtocol: UpstreamProtocol,
                               sourceLocation: SourceLocation = #_sourceLocation) {
        let expected = httpProtocol == .http1 ? "HTTP/1.1" : "HTTP/2.0"
        let versions = Set(upstream.arrivals.map(\.version))
        #expect(versions.isSubset(of: [expected]), "requests arrived on \(versions.sorted()), not \(expected)",
                sourceLocation: sourceLocation)
    }

    @Test("an https upstream signed by ca_file's CA answers, with host name and chain checked", arguments: protocols)
    func customCA(httpProtocol: UpstreamProtocol) async throws {
        let upstream = try await Self.upstream(\.server, speaking: httpProtocol)
        let gateway = try Self.gateway(upstream.baseURL, tls: try await TestCertificates.shared().trustingCA(),
                                       httpProtocol: httpProtocol)
        let response = try await gateway.request("GET", "/api/hello?x=1")
        #expect(response.status == 200)
        let echo = try TestUpstream.Echo.decode(response.body)
        #expect(echo.target == "/hello?x=1")
        #expect(echo.values("host") == ["127.0.0.1:\(upstream.port)"])
        Self.expectArrivals(upstream, on: httpProtocol)
        #expect(upstream.arrivals.count == 1)
        await gateway.stop()
        await upstream.shutdown()
    }

    struct BadServer: Sendable, CustomTestStringConvertible {
        var name: String
        var certificate: any KeyPath<TestCertificates, TestCertificates.Pair> & Sendable
        var reason: String
        var testDescription: String { name }
    }

    @Test("a certificate from another CA, an expired one or one for another host is a 502 upstream_tls_error, logged",
          arguments: [
            BadServer(name: "wrong CA", certificate: \.wrongCA, reason: "certificate verify failed"),
            BadServer(name: "expired", certificate: \.expired, reason: "certificate verify failed"),
            BadServer(name: "wrong host name", certificate: \.otherHost, reason: "hostname mismatch"),
          ], protocols)
    func verificationFailures(server: BadServer, httpProtocol: UpstreamProtocol) async throws {
        let upstream = try await Self.upstream(server.certificate, speaking: httpProtocol)
        let log = LogCapture(message: "upstream TLS failure", minimumLevel: .error)
        let gateway = try Self.gateway(upstream.baseURL, tls: try await TestCertificates.shared().trustingCA(),
                                       httpProtocol: httpProtocol, logger: log.logger)
        let response = try await gateway.request("GET", "/api/secret")
        #expect(response.status == 502)
        #expect(try Self.errorCode(response) == "upstream_tls_error")
        #expect(response.bodyText.contains(server.reason), "\(response.bodyText)")
        #expect(upstream.totalHits == 0, "no request may reach an unverified upstream")
        let line = try #require(log.records.first)
        #expect(line["upstream"]?.description == "billing")
        #expect(line["tls_error"]?.description.contains(server.reason) == true)
        await gateway.stop()
        await upstream.shutdown()
    }

    // HTTP/1.1 only: urlsession speaks nothing else (`check` refuses protocol: http2 on it).
    @Test("urlsession verifies against the system store: a test CA's certificate is a 502 upstream_tls_error")
    func urlsessionVerifies() async throws {
        let upstream = try await Self.upstream(\.server)
        let log = LogCapture(message: "upstream TLS failure", minimumLevel: .error)
        let gateway = try Self.gateway(upstream.baseURL, transport: .urlsession, tls: TLSClientConfig(), logger: log.logger)
        let response = try await gateway.request("GET", "/api/secret")
        #expect(response.status == 502)
        #expect(try Self.errorCode(response) == "upstream_tls_error")
        #expect(response.bodyText.contains("certificate verify failed: unable to get local issuer certificate"),
                "\(response.bodyText)")
        #expect(upstream.totalHits == 0)
        #expect(log.records.first?["upstream"]?.description == "billing")
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("server_name is the name the certificate is checked against; Host stays the configured authority",
          arguments: protocols)
    func serverName(httpProtocol: UpstreamProtocol) async throws {
        let upstream = try await Self.upstream(\.otherHost, speaking: httpProtocol)
        var tls = try await TestCertificates.shared().trustingCA()
        tls.serverName = "upstream.internal"
        let gateway = try Self.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol)
        let response = try await gateway.request("GET", "/api/named")
        #expect(response.status == 200)
        #expect(try TestUpstream.Echo.decode(response.body).values("host") == ["127.0.0.1:\(upstream.port)"])
        // Kept alive: the verified connection carries the next requests too. Each new client
        // connection goes to the next of the gateway's two threads in turn, each with its own
        // pool: one upstream connection per pair, reused after that (none expires meanwhile:
        // `idleTimeout` in `gateway`). On HTTP/2 too: each thread's pool keeps one connection.
        for _ in 0..<3 { #expect(try await gateway.request("GET", "/api/again").status == 200) }
        #expect(upstream.connections.accepted == 2, "one upstream connection per pair, each reused")
        #expect(upstream.totalHits == 4)
        Self.expectArrivals(upstream, on: httpProtocol)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("server_name is verified strictly: an IP-address name equal to the connected address does not stand in for it",
          arguments: protocols)
    func serverNameNotInCertificate(httpProtocol: UpstreamProtocol) async throws {
        // `server` names DNS:localhost and IP:127.0.0.1 — the address Portico connects to, but not the name.
        let upstream = try await Self.upstream(\.server, speaking: httpProtocol)
        let log = LogCapture(message: "upstream TLS failure", minimumLevel: .error)
        var tls = try await TestCertificates.shared().trustingCA()
        tls.serverName = "alt.example.test"
        let gateway = try Self.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol, logger: log.logger)
        let response = try await gateway.request("GET", "/api/secret")
        #expect(response.status == 502)
        #expect(try Self.errorCode(response) == "upstream_tls_error")
        #expect(response.bodyText.contains("hostname mismatch"), "\(response.bodyText)")
        #expect(upstream.totalHits == 0, "no request may reach an unverified upstream")
        let line = try #require(log.records.first)
        #expect(line["upstream"]?.description == "billing")
        #expect(line["tls_error"]?.description.contains("hostname mismatch") == true)
        await gateway.stop()

        // The certificate's DNS name as server_name is accepted.
        tls.serverName = "localhost"
        let named = try Self.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol)
        #expect(try await named.request("GET", "/api/secret").status == 200)
        Self.expectArrivals(upstream, on: httpProtocol)
        await named.stop()
        await upstream.shutdown()
    }

    @Test("a wildcard certificate names exactly one label in its place", arguments: [
        ("api.example.test", 200), ("API.EXAMPLE.TEST", 200), ("a.b.example.test", 502), ("example.test", 502),
    ], protocols)
    func wildcardServerName(_ expected: (serverName: String, status: Int), httpProtocol: UpstreamProtocol) async throws {
        let (serverName, status) = expected
        let upstream = try await Self.upstream(\.wildcard, speaking: httpProtocol)
        var tls = try await TestCertificates.shared().trustingCA()
        tls.serverName = serverName
        let gateway = try Self.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol)
        let response = try await gateway.request("GET", "/api/w")
        #expect(response.status == status, "\(response.bodyText)")
        if status == 502 { #expect(response.bodyText.contains("hostname mismatch"), "\(response.bodyText)") }
        #expect(upstream.totalHits == (status == 200 ? 1 : 0))
        Self.expectArrivals(upstream, on: httpProtocol)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("an upstream requiring a client certificate refuses Portico without one and accepts it with one",
          arguments: protocols)
    func mutualTLS(httpProtocol: UpstreamProtocol) async throws {
        let upstream = try await Self.upstream(\.server, requireClientCertificate: true, speaking: httpProtocol)
        let certificates = try await TestCertificates.shared()
        let without = try Self.gateway(upstream.baseURL, tls: try certificates.trustingCA(), httpProtocol: httpProtocol)
        let refused = try await without.request("GET", "/api/mtls")
        #expect(refused.status == 502)
        #expect(try Self.errorCode(refused) == "upstream_tls_error", "\(refused.bodyText)")
        #expect(refused.bodyText.contains("the server requires a client certificate"), "\(refused.bodyText)")
        #expect(upstream.totalHits == 0)
        await without.stop()

        var tls = try certificates.trustingCA()
        tls.clientIdentity = try certificates.clientIdentity()
        let with = try Self.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol)
        let accepted = try await with.request("GET", "/api/mtls")
        #expect(accepted.status == 200)
        Self.expectArrivals(upstream, on: httpProtocol)
        await with.stop()
        await upstream.shutdown()
    }

    @Test("min_version 1.3 refuses a server that stops at TLS 1.2", arguments: protocols)
    func minimumVersion(httpProtocol: UpstreamProtocol) async throws {
        let certificates = try await TestCertificates.shared()
        var serverTLS = try certificates.serverTLS(certificates.server)
        serverTLS.maximumTLSVersion = .tlsv12
        let upstream = TestUpstream(tls: serverTLS, speaking: httpProtocol == .http1 ? .http1 : .http2)
        try await upstream.start()
        var tls = try certificates.trustingCA()
        let accepted = try Self.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol)
        #expect(try await accepted.request("GET", "/api/v").status == 200)
        Self.expectArrivals(upstream, on: httpProtocol)
        await accepted.stop()

        tls.minimumVersion = .tls13
        let strict = try Self.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol)
        let refused = try await strict.request("GET", "/api/v")
        #expect(refused.status == 502)
        #expect(try Self.errorCode(refused) == "upstream_tls_error")
        #expect(refused.bodyText.contains("no TLS version both sides accept"), "\(refused.bodyText)")
        await strict.stop()
        await upstream.shutdown()
    }

    @Test("without min_version the floor is TLS 1.2: a TLS 1.1 server is refused", arguments: protocols)
    func defaultFloor(httpProtocol: UpstreamProtocol) async throws {
        let certificates = try await TestCertificates.shared()
        var serverTLS = try certificates.serverTLS(certificates.server)
        serverTLS.minimumTLSVersion = .tlsv1
        serverTLS.maximumTLSVersion = .tlsv11
        let upstream = TestUpstream(tls: serverTLS, speaking: httpProtocol == .http1 ? .http1 : .http2)
        try await upstream.start()
        let gateway = try Self.gateway(upstream.baseURL, tls: try certificates.trustingCA(), httpProtocol: httpProtocol)
        let refused = try await gateway.request("GET", "/api/old")
        #expect(refused.status == 502)
        #expect(try Self.errorCode(refused) == "upstream_tls_error")
        #expect(upstream.totalHits == 0)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("insecure_skip_verify accepts an untrusted certificate (and only when set)", arguments: protocols)
    func insecureSkipVerify(httpProtocol: UpstreamProtocol) async throws {
        let upstream = try await Self.upstream(\.wrongCA, speaking: httpProtocol)
        var tls = TLSClientConfig()
        tls.insecureSkipVerify = true
        let gateway = try Self.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol)
        #expect(try await gateway.request("GET", "/api/any").status == 200)
        Self.expectArrivals(upstream, on: httpProtocol)
        await gateway.stop()
        await upstream.shutdown()
    }

    /// A gateway whose `/api` route injects a token from `tokenURL`, fetched over `transport` with `tls`.
    static func tokenGateway(tokenURL: URL, transport: UpstreamConfig.Transport = .nio, tls: TLSClientConfig,
                             upstreamPort: Int) throws -> TestGateway {
        var oauth = OAuth2Config(tokenURL: tokenURL, clientID: "portico", clientSecret: "s3cret")
        oauth.transport = transport
        oauth.tls = tls
        var config = PorticoConfig()
        var credential = CredentialConfig(kind: .oauth2ClientCredentials(oauth))
        credential.timeout = .seconds(30)
        config.credentials["idp"] = credential
        config.middleware["auth"] = .auth(AuthConfig(credential: "idp"))
        config.upstreams["app"] = UpstreamConfig(name: "app", url: URL(string: "http://127.0.0.1:\(upstreamPort)")!)
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api"), upstream: "app", middleware: ["auth"])]
        return try TestGateway(config)
    }

    // HTTP/1.1 only: token endpoints have no `protocol` setting (fetched on HTTP/1.1).
    @Test("a token endpoint over TLS with a custom CA issues the token the upstream receives")
    func tokenEndpointOverTLS() async throws {
        let idp = try await Self.upstream(\.server)
        idp.route("/oauth2/token") { request in
            guard request.method == "POST", request.values("authorization").first?.hasPrefix("Basic ") == true else {
                return .text("bad token request", status: 400)
            }
            return TestUpstream.Response(status: 200, headers: [("Content-Type", "application/json")],
                                         body: #"{"access_token":"tls-token-1","token_type":"Bearer","expires_in":3600}"#)
        }
        let app = try await ProxyConformanceTests.started(ProxyLeg(transport: .nio, tls: false))
        let tokenURL = idp.baseURL.appendingPathComponent("oauth2/token")
        let gateway = try Self.tokenGateway(tokenURL: tokenURL, tls: try await TestCertificates.shared().trustingCA(),
                                            upstreamPort: app.port)
        let response = try await gateway.request("GET", "/api/orders")
        #expect(response.status == 200)
        #expect(try TestUpstream.Echo.decode(response.body).values("authorization") == ["Bearer tls-token-1"])
        #expect(idp.hits("/oauth2/token") == 1)
        await gateway.stop()

        // The same endpoint without its CA: no token, a 503, and the reason is TLS.
        let untrusted = try Self.tokenGateway(tokenURL: tokenURL, tls: TLSClientConfig(), upstreamPort: app.port)
        let refused = try await untrusted.request("GET", "/api/orders")
        #expect(refused.status == 503)
        #expect(try Self.errorCode(refused) == "credentials_unavailable")
        #expect(refused.bodyText.contains("TLS failure: certificate verify failed"), "\(refused.bodyText)")
        await untrusted.stop()

        // URLSession (the default) verifies against the system store and says why it refused.
        let urlsession = try Self.tokenGateway(tokenURL: tokenURL, transport: .urlsession, tls: TLSClientConfig(),
                                               upstreamPort: app.port)
        let refusedToo = try await urlsession.request("GET", "/api/orders")
        #expect(refusedToo.status == 503)
        #expect(refusedToo.bodyText.contains("TLS failure: certificate verify failed: unable to get local issuer certificate"),
                "\(refusedToo.bodyText)")
        await urlsession.stop()
        #expect(idp.hits("/oauth2/token") == 1)
        #expect(app.totalHits == 1)
        await app.shutdown()
        await idp.shutdown()
    }

    // HTTP/1.1 only, as tokenEndpointOverTLS.
    @Test("a token endpoint's server_name is verified strictly too: only a DNS name of the certificate counts")
    func tokenEndpointServerName() async throws {
        let token: TestUpstream.Handler = { _ in
            TestUpstream.Response(status: 200, headers: [("Content-Type", "application/json")],
                                  body: #"{"access_token":"named-token","token_type":"Bearer","expires_in":3600}"#)
        }
        let app = try await ProxyConformanceTests.started(ProxyLeg(transport: .nio, tls: false))
        // `server` names DNS:localhost and IP:127.0.0.1: not alt.example.test.
        let mismatched = try await Self.upstream(\.server)
        mismatched.route("/oauth2/token", token)
        var tls = try await TestCertificates.shared().trustingCA()
        tls.serverName = "alt.example.test"
        let refusing = try Self.tokenGateway(tokenURL: mismatched.baseURL.appendingPathComponent("oauth2/token"), tls: tls,
                                             upstreamPort: app.port)
        let refused = try await refusing.request("GET", "/api/orders")
        #expect(refused.status == 503)
        #expect(try Self.errorCode(refused) == "credentials_unavailable")
        #expect(refused.bodyText.contains("TLS failure: hostname mismatch"), "\(refused.bodyText)")
        #expect(mismatched.totalHits == 0)
        await refusing.stop()

        let named = try await Self.upstream(\.otherHost)
        named.route("/oauth2/token", token)
        tls.serverName = "upstream.internal"
        let gateway = try Self.tokenGateway(tokenURL: named.baseURL.appendingPathComponent("oauth2/token"), tls: tls,
                                            upstreamPort: app.port)
        let response = try await gateway.request("GET", "/api/orders")
        #expect(response.status == 200)
        #expect(try TestUpstream.Echo.decode(response.body).values("authorization") == ["Bearer named-token"])
        #expect(named.hits("/oauth2/token") == 1)
        await gateway.stop()
        await app.shutdown()
        await mismatched.shutdown()
        await named.shutdown()
    }

    // HTTP/1.1 only: this is the inbound listener (libmicrohttpd serves HTTP/1.1), not an upstream.
    @Test("listen.tls serves HTTPS that curl verifies with the CA, and refuses plain HTTP")
    func listenerTLS() async throws {
        let certificates = try await TestCertificates.shared()
        var config = PorticoConfig()
        config.listen.tls = ListenTLSConfig(certificatePEM: certificates.server.certificatePEM,
                                            privateKeyPEM: certificates.server.keyPEM)
        config.routes = [RouteConfig(name: "ping", match: .init(path: "/ping"),
                                     direct: .init(status: 200, body: "pong over tls\n")),
                         RouteConfig(name: "api", match: .init(pathPrefix: "/api"), upstream: "app")]
        let upstream = try await ProxyConformanceTests.started(ProxyLeg(transport: .nio, tls: false))
        config.upstreams["app"] = UpstreamConfig(name: "app", url: upstream.baseURL)
        let gateway = try TestGateway(config)

        for host in ["127.0.0.1", "localhost"] {
            let result = try await Curl.run(["--silent", "--show-error", "--cacert", certificates.ca.certificateFile,
                                             "https://\(host):\(gateway.port)/ping"])
            #expect(result.status == 0, "\(result.errors)")
            #expect(result.output == "pong over tls\n")
        }
        let untrusted = try await Curl.run(["--silent", "--show-error", "--cacert", certificates.otherCA.certificateFile,
                                            "https://127.0.0.1:\(gateway.port)/ping"])
        #expect(untrusted.status == 60, "curl: peer certificate cannot be authenticated with the given CA")

        // Proxied requests tell the upstream the client spoke HTTPS.
        let proxied = try await Curl.run(["--silent", "--cacert", certificates.ca.certificateFile,
                                          "https://localhost:\(gateway.port)/api/echo"])
        #expect(try TestUpstream.Echo.decode(Array(proxied.output.utf8)).values("x-forwarded-proto") == ["https"])

        // Plain HTTP on the TLS port gets no HTTP answer.
        let connection = try gateway.connect()
        try await connection.send("GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        let plain = try? await connection.readResponse()
        #expect(plain == nil || plain?.status != 200)
        await gateway.stop()
        await upstream.shutdown()
    }
}

/// Runs `curl` (installed by scripts/test) and collects its output.
enum Curl {
    struct Result {
        var status: Int32
        var output: String
        var errors: String
    }

    static func run(_ arguments: [String]) async throws -> Result {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-curl-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let outPath = directory.appendingPathComponent("out").path, errPath = directory.appendingPathComponent("err").path
        let process = try ChildProcess(executable: ChildProcess.locate("curl") ?? "/usr/bin/curl",
                                       arguments: ["--max-time", "30"] + arguments,
                                       standardOutput: .file(outPath), standardError: .file(errPath))
        var status = await process.waitForExit(timeout: .seconds(60))
        if status == nil {
            await process.terminate()
            status = process.exitStatus
        }
        return Result(status: status ?? -1,
                      output: (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "",
                      errors: (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "")
    }
}
