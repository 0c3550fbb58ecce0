import Foundation
import NIOSSL
@testable import Portico
import PorticoTesting
import Testing

@Suite("Config: tls.pin_sha256 and verify")
struct PinConfigTests {
    /// Two valid pins (base64 of 32 bytes).
    static let pinA = Data(repeating: 0xA1, count: 32).base64EncodedString()
    static let pinB = Data(repeating: 0xB2, count: 32).base64EncodedString()

    @Test("pins are read as 32-byte digests; verify defaults to full, pin_only is read")
    func valid() throws {
        let config = try load(TLSConfigTests.upstream("pin_sha256: [\"\(Self.pinA)\", \"\(Self.pinB)\"]"))
        let tls = try #require(config.upstreams["billing"]?.tls)
        #expect(tls.pins?.digests == [Array(repeating: 0xA1, count: 32), Array(repeating: 0xB2, count: 32)])
        #expect(tls.verification == .full)
        #expect(tls.nioConfiguration.certificateVerification == .fullVerification)
        let pinOnly = try load(TLSConfigTests.upstream("pin_sha256: [\"\(Self.pinA)\"]\nverify: pin_only"))
        #expect(pinOnly.upstreams["billing"]?.tls.verification == .pinOnly)
        #expect(pinOnly.upstreams["billing"]?.tls.nioConfiguration.certificateVerification == CertificateVerification.none)
    }

    @Test("check refuses a pin that is not 32 bytes of base64, duplicates and an empty list", arguments: [
        ("pin_sha256: [\"AAAA\"]", "upstreams.billing.tls.pin_sha256[0]: expected the base64 of a 32-byte SHA-256 digest"),
        ("pin_sha256: [\"not base64!\"]", "upstreams.billing.tls.pin_sha256[0]: expected the base64 of a 32-byte SHA-256 digest"),
        ("pin_sha256: [\"\(Data(repeating: 1, count: 48).base64EncodedString())\"]", "expected the base64 of a 32-byte SHA-256 digest"),
        ("pin_sha256: [\"\(pinA)\", \"\(pinA)\"]", "upstreams.billing.tls.pin_sha256[1]: duplicate pin"),
        ("pin_sha256: []", "upstreams.billing.tls.pin_sha256: must list at least one pin"),
        ("pin_sha256: \"\(pinA)\"", "upstreams.billing.tls.pin_sha256: expected a list"),
        ("verify: pin_only", "upstreams.billing.tls.verify: pin_only needs pin_sha256"),
        ("verify: pinned", "upstreams.billing.tls.verify: expected one of full, pin_only"),
        ("pin_sha256: [\"\(pinA)\"]\nverify: pin_only\nserver_name: a.test", "pin_only cannot be combined with ca_file or server_name"),
        ("pin_sha256: [\"\(pinA)\"]\ninsecure_skip_verify: true", "upstreams.billing.tls.pin_sha256: cannot be combined with insecure_skip_verify; to check the pin only, write verify: pin_only"),
    ])
    func invalid(tls: String, expected: String) {
        let found = diagnostics(TLSConfigTests.upstream(tls))
        #expect(found.contains { $0.contains(expected) }, "\(found)")
    }

    @Test("urlsession refuses a pin at load, naming transport: nio (FoundationNetworking cannot see the server's key)")
    func urlsessionRefuses() {
        let found = diagnostics(TLSConfigTests.upstream("pin_sha256: [\"\(Self.pinA)\"]\nverify: pin_only", transport: "urlsession"))
        #expect(found.count == 2, "\(found)")
        #expect(found.allSatisfy { $0.contains("the urlsession transport on Linux cannot pin a certificate key") && $0.hasSuffix("use transport: nio") }, "\(found)")
        #expect(diagnostics(TLSConfigTests.upstream("verify: full", transport: "urlsession")).isEmpty)
    }

    @Test("a token endpoint takes pins on nio and refuses them on urlsession; a Redis store refuses them")
    func tokenEndpointsAndStores() throws {
        let base = """
            credentials:
              idp:
                type: oauth2_client_credentials
                token_url: https://127.0.0.1:9443/oauth2/token
                client_id: portico
                client_secret: s3cret
            """
        let config = try load(base + "\n    transport: nio\n    tls: { pin_sha256: [\"\(Self.pinA)\"] }\n" + minimalRoute)
        guard case .oauth2ClientCredentials(let oauth)? = config.credentials["idp"]?.kind else {
            Issue.record("not an oauth2 credential")
            return
        }
        #expect(oauth.tls.pins?.digests == [Array(repeating: 0xA1, count: 32)])
        let refused = diagnostics(base + "\n    tls: { pin_sha256: [\"\(Self.pinA)\"] }\n" + minimalRoute)
        #expect(refused.count == 1 && refused[0].contains("credentials.idp.tls.pin_sha256: the urlsession transport on Linux cannot pin"), "\(refused)")

        let store = diagnostics("stores: { fleet: { type: redis, url: \"rediss://10.0.0.1\", tls: { pin_sha256: [\"\(Self.pinA)\"] } } }\n" + minimalRoute)
        #expect(store == ["portico.yaml:1 stores.fleet.tls.pin_sha256: pinning applies to upstreams and token endpoints only"], "\(store)")
    }

    @Test("a pin mismatch is its own kind, answered as 502 upstream_tls_error and counted under it")
    func kindAndMetric() async throws {
        let error = UpstreamError.certificatePinMismatch.gatewayError(upstream: "billing")
        #expect(error.kind == .upstreamTLSPinMismatch)
        #expect(error.status.code == 502)
        #expect(error.kind.code == "upstream_tls_error")
        #expect(error.message == "upstream billing: TLS: certificate pin mismatch")

        let metrics = RecordingMetrics()
        let endpoint = UpstreamEndpoint(client: PinFailingUpstream(),
                                        metrics: UpstreamMetrics(upstream: "billing", factory: metrics))
        await #expect(throws: GatewayError.self) {
            try await endpoint.respond(to: RetryFixture.request(), context: RetryFixture.context(clock: ManualClock()))
        }
        #expect(metrics.value("portico_upstream_errors_total", [("upstream", "billing"), ("protocol", "http1"), ("kind", "upstream_tls_pin_mismatch")]) == 1)
    }
}

/// An upstream whose every exchange fails with a pin mismatch.
private struct PinFailingUpstream: UpstreamClient {
    var config: UpstreamConfig { UpstreamConfig(name: "billing", url: URL(string: "https://127.0.0.1:1")!) }
    func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        throw UpstreamError.certificatePinMismatch.gatewayError(upstream: "billing")
    }
    func shutdown() async {}
    func retire() async {}
}
