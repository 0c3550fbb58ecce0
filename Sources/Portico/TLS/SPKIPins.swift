import Crypto
import NIOSSL

/// `tls.pin_sha256`: SHA-256 digests of SubjectPublicKeyInfo (the HPKP format, RFC 7469 §2.4),
/// as Envoy's `verify_certificate_spki`. The leaf's key must match one of them; a renewed
/// certificate for the same key still does. The chain is verified as well, unless
/// `verify: pin_only` (self-signed upstreams).
public struct SPKIPins: Sendable, Equatable {
    /// Each 32 bytes.
    public let digests: [[UInt8]]

    /// `nil` unless every digest is 32 bytes.
    public init?(_ digests: [[UInt8]]) {
        guard digests.allSatisfy({ $0.count == SHA256.byteCount }) else { return nil }
        self.digests = digests
    }

    /// The HPKP pin of `certificate`'s key: SHA-256 of its DER SubjectPublicKeyInfo.
    public static func digest(of certificate: NIOSSLCertificate) -> [UInt8]? {
        guard let spki = try? certificate.extractPublicKey().toSPKIBytes() else { return nil }
        return Array(SHA256.hash(data: spki))
    }

    public func matches(_ certificate: NIOSSLCertificate) -> Bool {
        guard let digest = Self.digest(of: certificate) else { return false }
        return digests.contains(digest)
    }

    /// What the log line and the 502 message say.
    static let mismatchDescription = "certificate pin mismatch"

    /// The error a connection fails with when the leaf's key is not pinned.
    struct Mismatch: Error, Sendable, CustomStringConvertible {
        var description: String { SPKIPins.mismatchDescription }
    }
}
