import Foundation
import NIOSSL

extension TLSClientConfig {
    /// `upstreams.NAME.tls` and `credentials.NAME.tls`. Files are read and parsed here, so a
    /// missing or malformed one is a config error with its key path. Keys the chosen transport
    /// cannot honour are refused rather than ignored.
    static func parse(_ m: ConfigMapping, transport: UpstreamConfig.Transport, pinning: Bool = true) -> TLSClientConfig {
        var c = TLSClientConfig()
        let caNode = m.value("ca_file")
        if let caNode, let bytes = caNode.fileBytes() {
            if let roots = try? NIOSSLCertificate.fromPEMBytes(bytes), !roots.isEmpty {
                c.trustRoots = roots
            } else {
                caNode.error("no PEM certificate could be read from this file")
            }
        }
        let certNode = m.value("client_cert_file"), keyNode = m.value("client_key_file")
        c.clientIdentity = parseClientIdentity(certNode: certNode, keyNode: keyNode, in: m)
        m.read("server_name", into: &c.serverName) { $0.hostName() }
        m.read("min_version", into: &c.minimumVersion) { $0.choice(Version.self) }
        let skipNode = m.value("insecure_skip_verify")
        m.read("insecure_skip_verify", into: &c.insecureSkipVerify) { $0.bool() }
        let pinNode = m.value("pin_sha256"), verifyNode = m.value("verify")
        if pinning {
            c.pins = pinNode?.spkiPins()
            m.read("verify", into: &c.verification) { $0.choice(Verification.self) }
        }
        m.finish()

        if !pinning {
            for node in [pinNode, verifyNode].compactMap({ $0 }) {
                node.error("pinning applies to upstreams and token endpoints only")
            }
        } else if transport == .nio {
            refuseContradictoryPinning(c, pinNode: pinNode, verifyNode: verifyNode, skipNode: skipNode, in: m)
        }

        if c.insecureSkipVerify, let skipNode {
            if c.trustRoots != nil || c.serverName != nil {
                skipNode.error("cannot be combined with ca_file or server_name, which only matter when verifying")
            } else {
                skipNode.warning("TLS verification is off: any certificate is accepted, so traffic can be intercepted")
            }
        }
        if transport == .urlsession {
            refuseOnURLSession(m, skipsVerification: c.insecureSkipVerify, pinOnly: c.verification == .pinOnly)
        }
        return c
    }

    /// What FoundationNetworking on Linux cannot do (measured on Swift 6.3.1, libcurl 7.88.1):
    /// it trusts libcurl's system bundle only, answers no server-trust or client-certificate
    /// challenge, and has no SNI, version or verification settings.
    private static func refuseOnURLSession(_ m: ConfigMapping, skipsVerification: Bool, pinOnly: Bool) {
        let refusals = [
            ("ca_file", "cannot trust a custom CA (libcurl uses the system trust store only)"),
            ("client_cert_file", "cannot present client certificates"),
            ("client_key_file", "cannot present client certificates"),
            ("server_name", "cannot override the TLS server name"),
            ("min_version", "cannot set a minimum TLS version"),
            ("insecure_skip_verify", "cannot turn verification off"),
            // Measured (README, TLS): no server-trust challenge reaches a URLSession delegate and
            // `URLProtectionSpace.serverTrust` is unavailable, so the key cannot be seen.
            ("pin_sha256", "cannot pin a certificate key (no server-trust challenge reaches Portico)"),
            ("verify", "cannot pin a certificate key (no server-trust challenge reaches Portico)"),
        ]
        for (key, problem) in refusals {
            guard let node = m.value(key) else { continue }
            if key == "insecure_skip_verify", !skipsVerification { continue }
            if key == "verify", !pinOnly { continue }
            node.error("the urlsession transport on Linux \(problem); use transport: nio")
        }
    }

    /// `verify: pin_only` needs pins and leaves nothing for `ca_file`/`server_name` to do; pins
    /// with `insecure_skip_verify` would be silently one-sided (`pin_only` says it plainly).
    private static func refuseContradictoryPinning(_ c: TLSClientConfig, pinNode: ConfigNode?, verifyNode: ConfigNode?,
                                                   skipNode: ConfigNode?, in m: ConfigMapping) {
        if c.insecureSkipVerify, let pinNode {
            pinNode.error("cannot be combined with insecure_skip_verify; to check the pin only, write verify: pin_only")
        }
        guard c.verification == .pinOnly, let verifyNode else { return }
        if pinNode == nil {
            verifyNode.error("pin_only needs pin_sha256: the pin is then the whole check")
        }
        if m.value("ca_file") != nil || m.value("server_name") != nil {
            verifyNode.error("pin_only cannot be combined with ca_file or server_name, which only matter when the chain is verified")
        }
        if skipNode != nil, c.insecureSkipVerify {
            verifyNode.error("pin_only cannot be combined with insecure_skip_verify")
        }
    }

    /// `client_cert_file` and `client_key_file` go together; the key must belong to the certificate.
    private static func parseClientIdentity(certNode: ConfigNode?, keyNode: ConfigNode?,
                                            in m: ConfigMapping) -> ClientIdentity? {
        switch (certNode, keyNode) {
        case (nil, nil):
            return nil
        case (let node?, nil):
            node.error("needs client_key_file as well")
            return nil
        case (nil, let node?):
            node.error("needs client_cert_file as well")
            return nil
        case (let certNode?, let keyNode?):
            var chain: [NIOSSLCertificate]?
            if let bytes = certNode.fileBytes() {
                if let certificates = try? NIOSSLCertificate.fromPEMBytes(bytes), !certificates.isEmpty {
                    chain = certificates
                } else {
                    certNode.error("no PEM certificate could be read from this file")
                }
            }
            var key: NIOSSLPrivateKey?
            let keyBytes = keyNode.fileBytes()
            if let keyBytes {
                key = try? NIOSSLPrivateKey(bytes: keyBytes, format: .pem)
                if key == nil { keyNode.error("no unencrypted PEM private key could be read from this file") }
            }
            guard let chain, let key, let keyBytes else { return nil }
            guard KeyPairCheck.matches(keyPEM: keyBytes, key: key, chain: chain) else {
                keyNode.error("this key does not belong to the certificate in client_cert_file")
                return nil
            }
            return ClientIdentity(certificateChain: chain, privateKey: key)
        }
    }
}

extension ListenTLSConfig {
    /// `listen.tls: { cert_file, key_file }`. Both are parsed here (with BoringSSL) so a bad
    /// file is a config error, not a listener that fails to start.
    static func parse(_ m: ConfigMapping) -> ListenTLSConfig? {
        let certNode = m.required("cert_file"), keyNode = m.required("key_file")
        m.finish()
        guard let certNode, let keyNode else { return nil }
        let certBytes = certNode.fileBytes(), keyBytes = keyNode.fileBytes()
        var chain: [NIOSSLCertificate]?
        if let certBytes {
            chain = try? NIOSSLCertificate.fromPEMBytes(certBytes)
            if chain?.isEmpty ?? true {
                certNode.error("no PEM certificate could be read from this file")
                chain = nil
            }
        }
        var key: NIOSSLPrivateKey?
        if let keyBytes {
            key = try? NIOSSLPrivateKey(bytes: keyBytes, format: .pem)
            if key == nil { keyNode.error("no unencrypted PEM private key could be read from this file") }
        }
        guard let chain, let key, let certBytes, let keyBytes else { return nil }
        guard KeyPairCheck.matches(keyPEM: keyBytes, key: key, chain: chain) else {
            keyNode.error("this key does not belong to the certificate in cert_file")
            return nil
        }
        return ListenTLSConfig(certificatePEM: certBytes, privateKeyPEM: keyBytes)
    }
}

extension ConfigNode {
    /// `pin_sha256: [base64, …]`: each the base64 of a 32-byte SHA-256 digest (HPKP's
    /// `pin-sha256` value, `openssl … | openssl dgst -sha256 -binary | base64`), no duplicates.
    func spkiPins() -> SPKIPins? {
        guard let items = list() else { return nil }
        var digests: [[UInt8]] = []
        var failed = false
        for item in items {
            guard let value = item.scalar(expected: "a base64 SHA-256 pin") else {
                failed = true
                continue
            }
            guard let data = Data(base64Encoded: value.text), data.count == 32 else {
                item.error("expected the base64 of a 32-byte SHA-256 digest of a SubjectPublicKeyInfo, got \(value.shown)")
                failed = true
                continue
            }
            if digests.contains([UInt8](data)) {
                item.error("duplicate pin \(value.shown)")
                failed = true
                continue
            }
            digests.append([UInt8](data))
        }
        if failed { return nil }
        guard !digests.isEmpty else {
            error("must list at least one pin")
            return nil
        }
        return SPKIPins(digests)
    }

    /// The bytes of the file this scalar names (relative to the configuration file's directory).
    func fileBytes() -> [UInt8]? {
        guard let path = nonEmptyString() else { return nil }
        switch context.interpolator.readData(path) {
        case .success(let data):
            return [UInt8](data)
        case .failure(let failure):
            error(failure.message)
            return nil
        }
    }

    /// A DNS name for SNI and certificate checks: letters, digits, `-` and `.`, no port.
    func hostName() -> String? {
        guard let value = scalar() else { return nil }
        let valid = !value.text.isEmpty && value.text.count <= 253 && value.text.unicodeScalars.allSatisfy {
            $0.isASCII && ($0.properties.isAlphabetic || ("0"..."9").contains($0) || $0 == "-" || $0 == ".")
        }
        guard valid else {
            error("expected a DNS host name, got \(value.shown)")
            return nil
        }
        return value.text.lowercased()
    }
}
