import Foundation
import NIOSSL

extension TLSClientConfig {
    /// `upstreams.NAME.tls` and `credentials.NAME.tls`. Files are read and parsed here, so a
    /// missing or malformed one is a config error with its key path. Keys the chosen transport
    /// cannot honour are refused rather than ignored.
    static func parse(_ m: ConfigMapping, transport: UpstreamConfig.Transport) -> TLSClientConfig {
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
        m.finish()

        if c.insecureSkipVerify, let skipNode {
            if c.trustRoots != nil || c.serverName != nil {
                skipNode.error("cannot be combined with ca_file or server_name, which only matter when verifying")
            } else {
                skipNode.warning("TLS verification is off: any certificate is accepted, so traffic can be intercepted")
            }
        }
        if transport == .urlsession {
            refuseOnURLSession(m, skipsVerification: c.insecureSkipVerify)
        }
        return c
    }

    /// What FoundationNetworking on Linux cannot do (measured on Swift 6.3.1, libcurl 7.88.1):
    /// it trusts libcurl's system bundle only, answers no server-trust or client-certificate
    /// challenge, and has no SNI, version or verification settings.
    private static func refuseOnURLSession(_ m: ConfigMapping, skipsVerification: Bool) {
        let refusals = [
            ("ca_file", "cannot trust a custom CA (libcurl uses the system trust store only)"),
            ("client_cert_file", "cannot present client certificates"),
            ("client_key_file", "cannot present client certificates"),
            ("server_name", "cannot override the TLS server name"),
            ("min_version", "cannot set a minimum TLS version"),
            ("insecure_skip_verify", "cannot turn verification off"),
        ]
        for (key, problem) in refusals {
            guard let node = m.value(key) else { continue }
            if key == "insecure_skip_verify", !skipsVerification { continue }
            node.error("the urlsession transport on Linux \(problem); use transport: nio")
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
