import Foundation
import Portico
import PorticoTesting
import Testing

@Suite("Config: tls sections")
struct TLSConfigTests {
    static func upstream(_ tls: String, transport: String = "nio", url: String = "https://127.0.0.1:8443") -> String {
        """
        upstreams:
          billing:
            url: \(url)
            transport: \(transport)
            tls:
        \(tls.split(separator: "\n").map { "      " + $0 }.joined(separator: "\n"))
        \(minimalRoute)
        """
    }

    @Test("an upstream's tls keys are read, files parsed at load")
    func upstreamKeys() async throws {
        let certs = try await TestCertificates.shared()
        let config = try load(Self.upstream("""
            ca_file: \(certs.ca.certificateFile)
            client_cert_file: \(certs.client.certificateFile)
            client_key_file: \(certs.client.keyFile)
            server_name: Upstream.Internal
            min_version: "1.3"
            """))
        let tls = try #require(config.upstreams["billing"]?.tls)
        #expect(tls.trustRoots == (try certs.trustingCA().trustRoots))
        #expect(tls.clientIdentity == (try certs.clientIdentity()))
        #expect(tls.serverName == "upstream.internal")
        #expect(tls.minimumVersion == .tls13)
        #expect(tls.insecureSkipVerify == false)
        #expect(config.warnings.isEmpty)
    }

    @Test("no tls section keeps verification against the system store")
    func defaults() async throws {
        let config = try load(Self.upstream("{}"))
        #expect(config.upstreams["billing"]?.tls.isDefault == true)
    }

    @Test("missing, malformed and mismatched files are errors naming the key path")
    func badFiles() async throws {
        let certs = try await TestCertificates.shared()
        let garbage = certs.directory + "/garbage.pem"
        _ = FileManager.default.createFile(atPath: garbage, contents: Data("not a certificate\n".utf8))
        let found = diagnostics(Self.upstream("""
            ca_file: /nonexistent/ca.pem
            client_cert_file: \(garbage)
            client_key_file: \(certs.client.keyFile)
            """))
        #expect(found.contains { $0.contains("upstreams.billing.tls.ca_file: cannot read file \"/nonexistent/ca.pem\" (no such file)") })
        #expect(found.contains { $0.contains("upstreams.billing.tls.client_cert_file: no PEM certificate could be read") })

        let mismatch = diagnostics(Self.upstream("""
            client_cert_file: \(certs.client.certificateFile)
            client_key_file: \(certs.server.keyFile)
            """))
        #expect(mismatch.count == 1)
        #expect(mismatch.first?.contains("upstreams.billing.tls.client_key_file: this key does not belong to the certificate") == true)

        let keyIsNoCertificate = diagnostics(Self.upstream("ca_file: \(certs.ca.keyFile)"))
        #expect(keyIsNoCertificate.first?.contains("tls.ca_file: no PEM certificate") == true)
    }

    @Test("a client certificate needs its key and the other way round")
    func pairedClientFiles() async throws {
        let certs = try await TestCertificates.shared()
        let found = diagnostics(Self.upstream("client_cert_file: \(certs.client.certificateFile)"))
        #expect(found.contains { $0.hasSuffix("upstreams.billing.tls.client_cert_file: needs client_key_file as well") })
        let other = diagnostics(Self.upstream("client_key_file: \(certs.client.keyFile)"))
        #expect(other.contains { $0.hasSuffix("upstreams.billing.tls.client_key_file: needs client_cert_file as well") })
    }

    @Test("the urlsession transport refuses each key it cannot honour, by key path")
    func urlsessionRefusals() async throws {
        let certs = try await TestCertificates.shared()
        let found = diagnostics(Self.upstream("""
            ca_file: \(certs.ca.certificateFile)
            client_cert_file: \(certs.client.certificateFile)
            client_key_file: \(certs.client.keyFile)
            server_name: upstream.internal
            min_version: "1.2"
            """, transport: "urlsession"))
        let expected = [
            "upstreams.billing.tls.ca_file: the urlsession transport on Linux cannot trust a custom CA",
            "upstreams.billing.tls.client_cert_file: the urlsession transport on Linux cannot present client certificates; use transport: nio",
            "upstreams.billing.tls.client_key_file: the urlsession transport on Linux cannot present client certificates",
            "upstreams.billing.tls.server_name: the urlsession transport on Linux cannot override the TLS server name",
            "upstreams.billing.tls.min_version: the urlsession transport on Linux cannot set a minimum TLS version",
        ]
        for message in expected {
            #expect(found.contains { $0.contains(message) }, "\(message)\nin \(found)")
        }
        #expect(found.count == expected.count)
        let skip = diagnostics(Self.upstream("insecure_skip_verify: true", transport: "urlsession"))
        #expect(skip.count == 1)
        #expect(skip.first?.contains("tls.insecure_skip_verify: the urlsession transport on Linux cannot turn verification off") == true)
        // Explicitly off is what urlsession does anyway.
        #expect(diagnostics(Self.upstream("insecure_skip_verify: false", transport: "urlsession")).isEmpty)
    }

    @Test("insecure_skip_verify is accepted with a warning, and refused next to ca_file or server_name")
    func insecureSkipVerify() async throws {
        let config = try load(Self.upstream("insecure_skip_verify: true"))
        #expect(config.upstreams["billing"]?.tls.insecureSkipVerify == true)
        #expect(config.warnings.map(\.description) == [
            "portico.yaml:6 upstreams.billing.tls.insecure_skip_verify: TLS verification is off: any certificate is accepted, so traffic can be intercepted",
        ])
        let certs = try await TestCertificates.shared()
        let found = diagnostics(Self.upstream("""
            ca_file: \(certs.ca.certificateFile)
            insecure_skip_verify: yes
            """))
        #expect(found.count == 1)
        #expect(found.first?.contains("tls.insecure_skip_verify: cannot be combined with ca_file or server_name") == true)
    }

    @Test("tls on an http:// URL, bad values and unknown keys are errors")
    func badValues() async throws {
        let found = diagnostics(Self.upstream("""
            server_name: "bad name:443"
            min_version: "1.1"
            verify: false
            verify_depth: 2
            """, url: "http://127.0.0.1:8080"))
        #expect(found.contains { $0.contains("upstreams.billing.tls: applies to https:// URLs only") })
        #expect(found.contains { $0.contains("upstreams.billing.tls.server_name: expected a DNS host name") })
        #expect(found.contains { $0.contains("upstreams.billing.tls.min_version: expected one of 1.2, 1.3, got \"1.1\"") })
        #expect(found.contains { $0.contains("upstreams.billing.tls.verify: expected one of full, pin_only, got \"false\"") })
        #expect(found.contains { $0.contains("upstreams.billing.tls.verify_depth: unknown key \"verify_depth\"") })
    }

    @Test("a credential's token endpoint takes transport and tls")
    func credentialTLS() async throws {
        let certs = try await TestCertificates.shared()
        let base = """
            credentials:
              idp:
                type: oauth2_client_credentials
                token_url: https://127.0.0.1:9443/oauth2/token
                client_id: portico
                client_secret: s3cret
            """
        let config = try load(base + """

                transport: nio
                tls: { ca_file: \(certs.ca.certificateFile), server_name: idp.internal }
            \(minimalRoute)
            """)
        guard case .oauth2ClientCredentials(let oauth)? = config.credentials["idp"]?.kind else {
            Issue.record("not an oauth2 credential")
            return
        }
        #expect(oauth.transport == .nio)
        #expect(oauth.tls.trustRoots == (try certs.trustingCA().trustRoots))
        #expect(oauth.tls.serverName == "idp.internal")

        let refused = diagnostics(base + """

                tls: { ca_file: \(certs.ca.certificateFile) }
            \(minimalRoute)
            """)
        #expect(refused.count == 1)
        #expect(refused.first?.contains("credentials.idp.tls.ca_file: the urlsession transport on Linux cannot trust a custom CA") == true)
    }

    @Test("listen.tls reads the certificate and key; both are required and must match")
    func listenTLS() async throws {
        let certs = try await TestCertificates.shared()
        let config = try load("""
            listen:
              tls: { cert_file: \(certs.server.certificateFile), key_file: \(certs.server.keyFile) }
            \(minimalRoute)
            """)
        #expect(config.listen.tls?.certificatePEM == certs.server.certificatePEM)
        #expect(config.listen.tls?.privateKeyPEM == certs.server.keyPEM)
        #expect(config.listen.tls?.description.contains("BEGIN") == false)

        let missing = diagnostics("""
            listen:
              tls: { cert_file: \(certs.server.certificateFile) }
            \(minimalRoute)
            """)
        #expect(missing == ["portico.yaml:2 listen.tls: missing required key \"key_file\""])
        let mismatched = diagnostics("""
            listen:
              tls: { cert_file: \(certs.server.certificateFile), key_file: \(certs.client.keyFile) }
            \(minimalRoute)
            """)
        #expect(mismatched.count == 1)
        #expect(mismatched.first?.contains("listen.tls.key_file: this key does not belong to the certificate in cert_file") == true)
    }

    @Test("older key forms (PKCS#1 RSA, SEC1 after EC PARAMETERS) are matched to their certificates, and mismatches found")
    func keyForms() async throws {
        let certs = try await TestCertificates.shared()
        func listen(_ cert: TestCertificates.Pair, _ key: TestCertificates.Pair) -> String {
            "listen:\n  tls: { cert_file: \(cert.certificateFile), key_file: \(key.keyFile) }\n\(minimalRoute)"
        }
        for pair in [certs.rsaPKCS1, certs.ecWithParameters] {
            #expect(try load(listen(pair, pair)).listen.tls?.privateKeyPEM == pair.keyPEM, "\(pair.keyFile)")
            for other in [certs.server, certs.rsaPKCS1, certs.ecWithParameters] where other.keyFile != pair.keyFile {
                let mismatched = diagnostics(listen(pair, other))
                #expect(mismatched.count == 1 && mismatched.first?.contains("this key does not belong to the certificate") == true,
                        "\(pair.certificateFile) with \(other.keyFile): \(mismatched)")
            }
        }
    }

    @Test("relative file paths start at the configuration file's directory, and reload reads them again")
    func relativePaths() async throws {
        let certs = try await TestCertificates.shared()
        let directory = certs.directory + "/relative-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: certs.ca.certificateFile, toPath: directory + "/ca.pem")
        let file = directory + "/portico.yaml"
        try Self.upstream("ca_file: ca.pem").write(toFile: file, atomically: true, encoding: .utf8)
        let config = try ConfigLoader.load(file: file)
        #expect(config.upstreams["billing"]?.tls.trustRoots == (try certs.trustingCA().trustRoots))

        try FileManager.default.removeItem(atPath: directory + "/ca.pem")
        #expect(throws: ConfigError.self) { try ConfigLoader.load(file: file) }
    }
}
