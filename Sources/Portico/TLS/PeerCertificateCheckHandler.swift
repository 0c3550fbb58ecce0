import NIOCore
import NIOSSL
import NIOTLS

/// Sits right after `NIOSSLClientHandler` (configured with `.noHostnameVerification`: BoringSSL
/// still verifies the chain) and checks the leaf against `server_name` with `ServerNameCheck`
/// once the handshake completes. Only then does `TLSUserEvent.handshakeCompleted` travel on,
/// and the connection owner sends nothing before it: an unverified server never sees a request.
///
/// Why not NIOSSL's own host name check: it also accepts any IP-address name equal to the
/// socket's address (see `ServerNameCheck`); its hooks to replace it are underscored or
/// replace chain verification as well.
final class ServerNameVerificationHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny

    private let serverName: String

    init(serverName: String) {
        self.serverName = serverName
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent else {
            context.fireUserInboundEventTriggered(event)
            return
        }
        let certificate = try? context.pipeline.syncOperations.nioSSL_peerCertificate()
        guard let certificate, ServerNameCheck.certificate(certificate, names: serverName) else {
            // The error TLSFailure already describes as a host name mismatch.
            context.fireErrorCaught(NIOSSLExtraError.failedToValidateHostname)
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}
