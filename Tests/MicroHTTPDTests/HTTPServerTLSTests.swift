import MicroHTTPD
import PorticoTesting
import Testing

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
}
