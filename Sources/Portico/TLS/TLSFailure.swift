import NIOSSL

/// Short descriptions of TLS failures for the log line and the 502 message: what failed,
/// never a URL, a header or key material.
enum TLSFailure {
    /// curl's error text as FoundationNetworking reports it: on Linux a TLS failure arrives as
    /// `URLError(-1)` carrying curl's message (measured on Swift 6.3.1, libcurl 7.88.1), e.g.
    /// "SSL certificate problem: certificate has expired". nil when the text is not about TLS.
    static func describe(curlMessage message: String) -> String? {
        let certificateProblem = "SSL certificate problem: "
        if let range = message.range(of: certificateProblem) {
            // OpenSSL's verify reason ("unable to get local issuer certificate", …): no names in it.
            let reason = message[range.upperBound...].prefix { $0 != "\n" }.prefix(120)
            return "certificate verify failed: \(reason)"
        }
        if message.contains("no alternative certificate subject name matches")
            || message.contains("certificate subject name") {
            return "hostname mismatch: the certificate does not name this host"
        }
        if message.contains("SSL") || message.contains("TLS") {
            return "handshake failed"
        }
        return nil
    }

    /// NIOSSL errors as a connection's pipeline passes them on; nil for anything else.
    static func describe(nioError error: any Error) -> String? {
        if let extra = error as? NIOSSLExtraError, extra == .failedToValidateHostname {
            return "hostname mismatch: the certificate does not name this host"
        }
        if let error = error as? NIOSSLError {
            switch error {
            case .handshakeFailed(let stack):
                return describe(boringSSLErrors: "\(stack)")
            case .uncleanShutdown:
                return "the server closed the TLS connection without a close_notify (a refused client certificate?)"
            default:
                return "TLS error: \(error)"
            }
        }
        if let error = error as? BoringSSLError {
            return describe(boringSSLErrors: "\(error)")
        }
        return nil
    }

    /// BoringSSL's error stack text, reduced to its reason codes.
    private static func describe(boringSSLErrors text: String) -> String {
        if text.contains("CERTIFICATE_VERIFY_FAILED") {
            return "certificate verify failed: untrusted issuer, expired or not yet valid"
        }
        let reasons = ["CERTIFICATE_REQUIRED": "the server requires a client certificate",
                       "UNKNOWN_CA": "the server does not trust the client certificate",
                       "BAD_CERTIFICATE": "the server rejected the client certificate",
                       "PROTOCOL_VERSION": "no TLS version both sides accept",
                       "UNSUPPORTED_PROTOCOL": "no TLS version both sides accept",
                       "WRONG_VERSION_NUMBER": "the server did not answer with TLS (plain HTTP?)",
                       "HANDSHAKE_FAILURE": "handshake failure alert from the server"]
        for (code, meaning) in reasons.sorted(by: { $0.key < $1.key }) where text.contains(code) {
            return "handshake failed: \(meaning)"
        }
        return "handshake failed"
    }
}
