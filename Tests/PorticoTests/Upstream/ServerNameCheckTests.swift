import NIOSSL
@testable import Portico
import PorticoTesting
import Testing

@Suite("server_name against the certificate (RFC 6125)")
struct ServerNameCheckTests {
    @Test("DNS names match whole, case-insensitively; a wildcard is one whole leftmost label", arguments: [
        ("billing.internal", "billing.internal", true),
        ("Billing.Internal", "billing.internal", true),
        ("billing.internal.", "billing.internal", true),
        ("billing.internal", "other.internal", false),
        ("*.example.test", "api.example.test", true),
        ("*.example.test", "a.b.example.test", false),
        ("*.example.test", "example.test", false),
        ("*.example.test", ".example.test", false),
        ("*.test", "example.test", false),
        ("a*.example.test", "ab.example.test", false),
        ("api.*.test", "api.example.test", false),
        ("*", "localhost", false),
    ])
    func patterns(pattern: String, reference: String, expected: Bool) {
        #expect(ServerNameCheck.matches(pattern: pattern, reference: reference) == expected)
    }

    @Test("only DNS names count for a DNS server_name: an IP-address name never stands in for it")
    func certificates() async throws {
        let certificates = try await TestCertificates.shared()
        func leaf(_ pair: TestCertificates.Pair) throws -> NIOSSLCertificate {
            try #require(try NIOSSLCertificate.fromPEMFile(pair.certificateFile).first)
        }
        let server = try leaf(certificates.server)  // DNS:localhost, IP:127.0.0.1
        #expect(ServerNameCheck.certificate(server, names: "localhost"))
        #expect(ServerNameCheck.certificate(server, names: "LOCALHOST."))
        #expect(!ServerNameCheck.certificate(server, names: "alt.example.test"))
        #expect(ServerNameCheck.certificate(server, names: "127.0.0.1"), "an IP server_name matches an IP name")
        #expect(!ServerNameCheck.certificate(server, names: "127.0.0.2"))
        #expect(!ServerNameCheck.certificate(server, names: "::1"))

        let wildcard = try leaf(certificates.wildcard)  // DNS:*.example.test, IP:127.0.0.1
        #expect(ServerNameCheck.certificate(wildcard, names: "api.example.test"))
        #expect(!ServerNameCheck.certificate(wildcard, names: "example.test"))

        let other = try leaf(certificates.otherHost)  // DNS:upstream.internal, CN other-host
        #expect(ServerNameCheck.certificate(other, names: "upstream.internal"))
        #expect(!ServerNameCheck.certificate(other, names: "other-host"), "with alternative names the common name is ignored")

        // Self-signed with no alternative names: the common name is the only name.
        let commonNameOnly = try leaf(certificates.rsaPKCS1)  // CN rsa-pkcs1
        #expect(ServerNameCheck.certificate(commonNameOnly, names: "rsa-pkcs1"))
        #expect(!ServerNameCheck.certificate(commonNameOnly, names: "localhost"))
    }
}
