import Foundation
import NIOSSL

/// `tls:` of an upstream or an OAuth2 credential: how Portico verifies the server and which
/// certificate it presents. Files are read and parsed when the configuration loads (and on
/// every reload), so a running gateway never meets a missing or malformed file.
///
/// Verification is on by default: the chain must lead to a trusted root (the system's, or
/// `ca_file`'s when set) and the certificate must name the host (or `server_name`). On `nio`,
/// `server_name` is checked strictly: only the certificate's DNS names count (`ServerNameCheck`).
public struct TLSClientConfig: Sendable, Equatable {
    public enum Version: String, Sendable, Equatable, CaseIterable {
        case tls12 = "1.2"
        case tls13 = "1.3"
    }

    /// A client certificate chain (leaf first) and its private key, for mutual TLS.
    public struct ClientIdentity: Sendable, Equatable {
        public var certificateChain: [NIOSSLCertificate]
        public var privateKey: NIOSSLPrivateKey

        public init(certificateChain: [NIOSSLCertificate], privateKey: NIOSSLPrivateKey) {
            self.certificateChain = certificateChain
            self.privateKey = privateKey
        }
    }

    /// Roots from `ca_file`, trusted instead of the system's; `nil`: the system trust store.
    public var trustRoots: [NIOSSLCertificate]?
    public var clientIdentity: ClientIdentity?
    /// Name sent as SNI and checked against the certificate, instead of the URL's host.
    public var serverName: String?
    /// `nil` means TLS 1.2 on `nio` (NIOSSL alone would allow 1.0).
    public var minimumVersion: Version?
    /// Neither chain nor host name is checked. Only ever set explicitly, and warned about at load.
    public var insecureSkipVerify: Bool = false

    /// `verify:` — what is checked besides `pin_sha256`.
    public enum Verification: String, Sendable, Equatable, CaseIterable {
        /// The chain and the host name, as always (the default).
        case full
        /// Only the pin: for self-signed upstreams. Needs `pin_sha256`.
        case pinOnly = "pin_only"
    }

    /// `pin_sha256:` — the leaf's key must match one of these (`SPKIPins`); `nil`: no pinning.
    public var pins: SPKIPins?
    public var verification: Verification = .full

    public init() {}

    /// True when nothing differs from the default (system roots, full verification).
    public var isDefault: Bool { self == TLSClientConfig() }

    /// The NIOSSL configuration the `nio` transport (and token calls over it) use.
    public var nioConfiguration: TLSConfiguration {
        var configuration = TLSConfiguration.makeClientConfiguration()
        if let trustRoots {
            configuration.trustRoots = .certificates(trustRoots)
        }
        if let clientIdentity {
            configuration.certificateChain = clientIdentity.certificateChain.map { .certificate($0) }
            configuration.privateKey = .privateKey(clientIdentity.privateKey)
        }
        // NIOSSL would accept TLS 1.0; Portico's floor is 1.2 unless `min_version` raises it.
        configuration.minimumTLSVersion = minimumVersion == .tls13 ? .tlsv13 : .tlsv12
        if insecureSkipVerify || (verification == .pinOnly && pins != nil) {
            // `pin_only`: the pin (`PeerCertificateCheckHandler`) is the whole check.
            configuration.certificateVerification = .none
        }
        return configuration
    }

    /// The context for connections that check `server_name` themselves (`HTTP1ConnectionPool`):
    /// BoringSSL verifies the chain, `PeerCertificateCheckHandler` the name. NIOSSL's own name
    /// check is off: it would also accept an IP-address name equal to the connected address.
    func strictServerNameContext(alpn: [String] = []) -> NIOSSLContext? {
        var configuration = nioConfiguration
        configuration.applicationProtocols = alpn
        configuration.certificateVerification = .noHostnameVerification
        return try? NIOSSLContext(configuration: configuration)
    }
}

/// `listen.tls:` — the proxy listener terminates TLS (libmicrohttpd with GnuTLS).
public struct ListenTLSConfig: Sendable, Equatable, CustomStringConvertible {
    /// PEM, leaf first, as read from `cert_file`.
    public var certificatePEM: [UInt8]
    /// PEM, as read from `key_file`. Never printed.
    public var privateKeyPEM: [UInt8]

    public init(certificatePEM: [UInt8], privateKeyPEM: [UInt8]) {
        self.certificatePEM = certificatePEM
        self.privateKeyPEM = privateKeyPEM
    }

    public var description: String {
        "ListenTLSConfig(certificate: \(certificatePEM.count) bytes, key: <redacted>)"
    }
}
