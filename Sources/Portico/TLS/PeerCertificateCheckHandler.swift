import NIOCore
import NIOSSL
import NIOTLS

/// Sits right after `NIOSSLClientHandler` and checks the leaf once the handshake completes
/// (BoringSSL has verified the chain by then, unless `verify: pin_only`). Only if it passes does
/// `TLSUserEvent.handshakeCompleted` travel on, and the connection owner sends nothing before it:
/// a server that fails the check never sees a request. Otherwise the check's error is fired (what
/// `TLSFailure` classifies) and the connection closed.
///
/// Why after the handshake rather than in NIOSSL: its host name check also accepts any
/// IP-address name equal to the socket's address (see `ServerNameCheck`), and its hooks to
/// replace that are underscored or replace chain verification as well; its custom verification
/// callback replaces BoringSSL's chain and name verification, which would then have to be
/// written again here for the default `verify: full`. After the handshake a check composes with
/// whatever BoringSSL checked, as Envoy's SPKI check composes with its chain verification.
final class PeerCertificateCheckHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    enum Check: Sendable {
        /// `server_name`: the leaf must name it (`ServerNameCheck`; NIOSSL's own check is off, see
        /// `TLSClientConfig.strictServerNameContext`).
        case serverName(String)
        /// `tls.pin_sha256`: the leaf's key must match one of the pins.
        case pins(SPKIPins)

        func passes(_ certificate: NIOSSLCertificate) -> Bool {
            switch self {
            case .serverName(let names): ServerNameCheck.certificate(certificate, names: names)
            case .pins(let pins): pins.matches(certificate)
            }
        }

        /// The error the connection fails with.
        var failure: any Error {
            switch self {
            // The error TLSFailure already describes as a host name mismatch.
            case .serverName: NIOSSLExtraError.failedToValidateHostname
            case .pins: SPKIPins.Mismatch()
            }
        }
    }

    private let check: Check

    init(_ check: Check) {
        self.check = check
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        let certificate = try? context.pipeline.syncOperations.nioSSL_peerCertificate()
        guard let certificate, check.passes(certificate) else {
            context.fireErrorCaught(check.failure)
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
