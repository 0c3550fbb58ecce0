import Foundation
import Logging
import NIOSSL
import Portico
import PorticoTesting
import Testing

/// `tls.pin_sha256` and `verify: pin_only` on the `nio` transport, with certificates made by
/// `openssl` at test time (`TestCertificates`); upstreams on HTTP/1.1 and HTTP/2 (ALPN `h2`).
@Suite("Certificate pinning for upstreams and token endpoints")
struct CertificatePinningTests {
    static func pin(_ pair: KeyPath<TestCertificates, TestCertificates.Pair>) async throws -> [UInt8] {
        let certificates = try await TestCertificates.shared()
        let certificate = try #require(try NIOSSLCertificate.fromPEMFile(certificates[keyPath: pair].certificateFile).first)
        return try #require(SPKIPins.digest(of: certificate))
    }

    /// Trusting the test CA (unless `pinOnly`), pinned to `pins`.
    static func tls(pins: [[UInt8]], pinOnly: Bool = false) async throws -> TLSClientConfig {
        var tls = pinOnly ? TLSClientConfig() : try await TestCertificates.shared().trustingCA()
        let pinSet: SPKIPins = try #require(SPKIPins(pins))
        tls.pins = pinSet
        if pinOnly { tls.verification = .pinOnly }
        return tls
    }

    @Test("the pin is HPKP's: openssl's SHA-256 of the DER SubjectPublicKeyInfo, base64")
    func hpkpFormat() async throws {
        let certificates = try await TestCertificates.shared()
        // openssl x509 -pubkey | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64
        let script = "openssl x509 -in '\(certificates.server.certificateFile)' -pubkey -noout"
            + " | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64"
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-pin-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let out = directory.appendingPathComponent("out").path
        let process = try ChildProcess(executable: ChildProcess.locate("sh") ?? "/bin/sh", arguments: ["-c", script],
                                       standardOutput: .file(out))
        #expect(await process.waitForExit(timeout: .seconds(60)) == 0)
        let expected = try String(contentsOfFile: out, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(Data(try await Self.pin(\.server)).base64EncodedString() == expected)
        #expect(try await Self.pin(\.renewedServer) == (try await Self.pin(\.server)), "a renewal keeps the key")
        #expect(try await Self.pin(\.wildcard) != (try await Self.pin(\.server)))
    }

    @Test("a pinned key passes, also in a renewed certificate; another pin in the list is fine",
          arguments: TLSTests.protocols)
    func sameKeyPasses(httpProtocol: UpstreamProtocol) async throws {
        let tls = try await Self.tls(pins: [Array(repeating: 7, count: 32), try await Self.pin(\.server)])
        for pair in [\TestCertificates.server, \TestCertificates.renewedServer] {
            let upstream = try await TLSTests.upstream(pair, speaking: httpProtocol)
            let gateway = try TLSTests.gateway(upstream.baseURL, tls: tls, httpProtocol: httpProtocol)
            let response = try await gateway.request("GET", "/api/pinned")
            #expect(response.status == 200)
            #expect(try TestUpstream.Echo.decode(response.body).target == "/pinned")
            TLSTests.expectArrivals(upstream, on: httpProtocol)
            await gateway.stop()
            await upstream.shutdown()
        }
    }

    @Test("a valid certificate with another key is a 502 upstream_tls_error, logged and counted; no request reaches it",
          arguments: TLSTests.protocols)
    func differentKeyFails(httpProtocol: UpstreamProtocol) async throws {
        // `wildcard` is signed by the trusted CA and names 127.0.0.1: only its key is wrong.
        let upstream = try await TLSTests.upstream(\.wildcard, speaking: httpProtocol)
        let log = LogCapture(message: "upstream TLS failure", minimumLevel: .error)
        let gateway = try TLSTests.gateway(upstream.baseURL, tls: try await Self.tls(pins: [try await Self.pin(\.server)]),
                                           httpProtocol: httpProtocol, logger: log.logger)
        let response = try await gateway.request("GET", "/api/secret", headers: [("X-Request-ID", "pin-req-1")])
        #expect(response.status == 502)
        let body = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
        #expect(body.error == "upstream_tls_error")
        #expect(body.request_id == "pin-req-1")
        #expect(response.bodyText.contains("certificate pin mismatch"), "\(response.bodyText)")
        #expect(upstream.totalHits == 0, "no request may reach an unpinned upstream")
        let line = try #require(log.records.first)
        #expect(line["upstream"]?.description == "billing")
        #expect(line["tls_error"]?.description == "certificate pin mismatch")
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("a pinned key under a CA that is not trusted still fails: the chain is verified too", arguments: TLSTests.protocols)
    func pinWithWrongCAFails(httpProtocol: UpstreamProtocol) async throws {
        let upstream = try await TLSTests.upstream(\.wrongCA, speaking: httpProtocol)
        let gateway = try TLSTests.gateway(upstream.baseURL, tls: try await Self.tls(pins: [try await Self.pin(\.wrongCA)]),
                                           httpProtocol: httpProtocol)
        let response = try await gateway.request("GET", "/api/secret")
        #expect(response.status == 502)
        #expect(try TLSTests.errorCode(response) == "upstream_tls_error")
        #expect(response.bodyText.contains("certificate verify failed"), "\(response.bodyText)")
        #expect(upstream.totalHits == 0)
        await gateway.stop()
        await upstream.shutdown()
    }

    @Test("verify: pin_only accepts a self-signed certificate with the pinned key, and only that key",
          arguments: TLSTests.protocols)
    func pinOnlySelfSigned(httpProtocol: UpstreamProtocol) async throws {
        // A self-signed certificate naming no host at all: only the pin is checked.
        let upstream = try await TLSTests.upstream(\.rsaPKCS1, speaking: httpProtocol)
        let pinned = try TLSTests.gateway(upstream.baseURL, tls: try await Self.tls(pins: [try await Self.pin(\.rsaPKCS1)], pinOnly: true),
                                          httpProtocol: httpProtocol)
        #expect(try await pinned.request("GET", "/api/self").status == 200)
        await pinned.stop()

        let other = try TLSTests.gateway(upstream.baseURL, tls: try await Self.tls(pins: [try await Self.pin(\.ecWithParameters)], pinOnly: true),
                                         httpProtocol: httpProtocol)
        let refused = try await other.request("GET", "/api/self")
        #expect(refused.status == 502)
        #expect(refused.bodyText.contains("certificate pin mismatch"), "\(refused.bodyText)")
        await other.stop()

        // Without pin_only the same pin does not make a self-signed certificate trusted.
        let full = try TLSTests.gateway(upstream.baseURL, tls: try await Self.tls(pins: [try await Self.pin(\.rsaPKCS1)]),
                                        httpProtocol: httpProtocol)
        let unverified = try await full.request("GET", "/api/self")
        #expect(unverified.status == 502)
        #expect(unverified.bodyText.contains("certificate verify failed"), "\(unverified.bodyText)")
        await full.stop()
        #expect(upstream.totalHits == 1)
        TLSTests.expectArrivals(upstream, on: httpProtocol)
        await upstream.shutdown()
    }

    // HTTP/1.1 only: token endpoints have no `protocol` setting (fetched on HTTP/1.1).
    @Test("a token endpoint takes the same pins: a match issues the token, a mismatch is a TLS failure")
    func tokenEndpoint() async throws {
        let idp = try await TLSTests.upstream(\.server)
        idp.route("/oauth2/token") { _ in
            TestUpstream.Response(status: 200, headers: [("Content-Type", "application/json")],
                                  body: #"{"access_token":"pinned-token","token_type":"Bearer","expires_in":3600}"#)
        }
        let app = try await ProxyConformanceTests.started(ProxyLeg(transport: .nio, tls: false))
        let tokenURL = idp.baseURL.appendingPathComponent("oauth2/token")
        let gateway = try TLSTests.tokenGateway(tokenURL: tokenURL, tls: try await Self.tls(pins: [try await Self.pin(\.server)]),
                                                upstreamPort: app.port)
        let response = try await gateway.request("GET", "/api/orders")
        #expect(response.status == 200)
        #expect(try TestUpstream.Echo.decode(response.body).values("authorization") == ["Bearer pinned-token"])
        await gateway.stop()

        let mismatched = try TLSTests.tokenGateway(tokenURL: tokenURL, tls: try await Self.tls(pins: [try await Self.pin(\.wildcard)]),
                                                   upstreamPort: app.port)
        let refused = try await mismatched.request("GET", "/api/orders")
        #expect(refused.status == 503)
        #expect(try TLSTests.errorCode(refused) == "credentials_unavailable")
        #expect(refused.bodyText.contains("TLS failure: certificate pin mismatch"), "\(refused.bodyText)")
        await mismatched.stop()
        #expect(idp.hits("/oauth2/token") == 1)
        await app.shutdown()
        await idp.shutdown()
    }
}
