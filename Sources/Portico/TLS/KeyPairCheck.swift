import NIOSSL
import X509

/// Whether a private key belongs to a certificate, checked while a configuration is read.
enum KeyPairCheck {
    /// True when `key` (read from `keyPEM`) belongs to `chain`'s leaf: their public keys are
    /// equal. Compared with swift-certificates rather than by building a throwaway
    /// `NIOSSLContext` and letting BoringSSL refuse the pair: swift-nio-ssl 2.37 leaks the context
    /// when that refusal throws (found by LeakSanitizer; measured: 300 refused reloads grew the
    /// process by 1.1 MiB, and by 0.1 MiB with this check). Keys swift-certificates cannot read
    /// (it takes PKCS#8, SEC1 and PKCS#1 RSA, P-256/384/521, Ed25519, RSA) still go to BoringSSL.
    static func matches(keyPEM: [UInt8], key: NIOSSLPrivateKey, chain: [NIOSSLCertificate]) -> Bool {
        guard let leaf = chain.first else { return false }
        guard let parsedKey = try? Certificate.PrivateKey(pemEncoded: String(decoding: keyPEM, as: UTF8.self)),
              let der = try? leaf.toDERBytes(),
              let certificate = try? Certificate(derEncoded: der) else {
            let probe = TLSConfiguration.makeServerConfiguration(certificateChain: chain.map { .certificate($0) },
                                                                 privateKey: .privateKey(key))
            return (try? NIOSSLContext(configuration: probe)) != nil
        }
        return parsedKey.publicKey == certificate.publicKey
    }
}
