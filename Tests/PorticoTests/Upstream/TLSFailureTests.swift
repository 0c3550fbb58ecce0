import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
@testable import Portico
import Testing

@Suite("TLS failure descriptions")
struct TLSFailureTests {
    /// curl's messages as URLSession on Linux reported them (measured against openssl s_server).
    @Test("curl's TLS messages become short reasons without host names", arguments: [
        ("SSL certificate problem: unable to get local issuer certificate",
         "certificate verify failed: unable to get local issuer certificate"),
        ("SSL certificate problem: certificate has expired", "certificate verify failed: certificate has expired"),
        ("SSL certificate problem: self-signed certificate in certificate chain",
         "certificate verify failed: self-signed certificate in certificate chain"),
        ("SSL: no alternative certificate subject name matches target host name 'billing.internal'",
         "hostname mismatch: the certificate does not name this host"),
        ("OpenSSL/3.0.19: error:0A000438:SSL routines::tlsv1 alert internal error", "handshake failed"),
    ])
    func curlMessages(message: String, expected: String) {
        #expect(TLSFailure.describe(curlMessage: message) == expected)
    }

    @Test("messages that are not about TLS are left to the other classifications")
    func notTLS() {
        #expect(TLSFailure.describe(curlMessage: "Couldn't connect to server") == nil)
        #expect(TLSFailure.describe(curlMessage: "Failed writing received data to disk/application") == nil)
    }

    @Test("URLError -1 carrying a TLS message is a TLS failure before a response, not after")
    func urlsessionClassification() {
        let error = URLError(.unknown, userInfo: [NSLocalizedDescriptionKey: "SSL certificate problem: certificate has expired"])
        #expect(URLSessionUpstream.classify(error, hadResponse: false, limit: 1)
            == .tls("certificate verify failed: certificate has expired"))
        #expect(URLSessionUpstream.classify(URLError(.unknown), hadResponse: false, limit: 1) == .connectFailed("transport failure"))
        #expect(UpstreamError.tls("hostname mismatch").gatewayError(upstream: "billing")
            == GatewayError(.upstreamTLSError, message: "upstream billing: TLS: hostname mismatch"))
    }
}
