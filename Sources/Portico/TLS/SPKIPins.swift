import Crypto
import NIOCore
import NIOSSL
import NIOTLS

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

/// Sits right after `NIOSSLClientHandler` and checks the leaf's key against `SPKIPins` once the
/// handshake completes (BoringSSL has verified the chain by then, unless `verify: pin_only`).
/// Only a match lets `TLSUserEvent.handshakeCompleted` travel on, and the connection owner sends
/// nothing before it: an unpinned server never sees a request.
///
/// Why not NIOSSL's custom verification callback: it replaces BoringSSL's chain and host name
/// verification, which would then have to be written again here for the default `verify: full`.
/// After the handshake, the pin composes with whatever BoringSSL (and `ServerNameVerificationHandler`)
/// checked, as Envoy's SPKI check composes with its chain verification.
final class PinVerificationHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    private let pins: SPKIPins

    init(pins: SPKIPins) {
        self.pins = pins
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        let certificate = try? context.pipeline.syncOperations.nioSSL_peerCertificate()
        guard let certificate, pins.matches(certificate) else {
            context.fireErrorCaught(SPKIPins.Mismatch())
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
