import Logging

/// What went wrong talking to an upstream, before it is mapped to the client-facing
/// `GatewayError` (its kind decides status and code; this value stays on as its cause).
/// Details are words a person reads ("connection refused"), never a library's numeric code.
public enum UpstreamError: Error, Sendable, Equatable {
    /// No connection: refused, unreachable, name resolution failed.
    case connectFailed(String)
    /// No connection within `connect_timeout`: connecting took too long, or (nio) every pooled
    /// connection stayed busy that long.
    case connectTimeout
    /// The exchange did not finish within `min(timeout, request deadline)`.
    case timeout
    /// The connection was reset or closed before the response was complete.
    case connectionClosed(String)
    /// The response body exceeded `max_response_bytes`.
    case responseTooLarge(limit: Int)
    /// The upstream sent something that is not valid HTTP.
    case protocolError(String)
    /// TLS handshake or certificate failure; the detail says what failed (see `TLSFailure`).
    case tls(String)
    /// The leaf certificate's key matches none of `tls.pin_sha256` (`SPKIPins`).
    case certificatePinMismatch

    /// The error a client sees. Connect/reset → 502 `upstream_unavailable`; TLS → 502 `upstream_tls_error`;
    /// timeouts → 504 `upstream_timeout` (like nginx, a connect timeout is a timeout);
    /// too large → 502 `upstream_response_too_large`; protocol → 502 `upstream_protocol_error`.
    public func gatewayError(upstream: String) -> GatewayError {
        let (kind, message): (GatewayError.Kind, String) = switch self {
        case .connectFailed(let detail):
            (.upstreamConnectFailed, "upstream \(upstream): \(detail)")
        case .connectTimeout:
            (.upstreamConnectTimeout, "upstream \(upstream): no connection within the connect timeout")
        case .timeout:
            (.upstreamTimeout, "upstream \(upstream) did not answer within the deadline")
        case .connectionClosed(let detail):
            (.upstreamConnectionClosed, "upstream \(upstream): connection closed: \(detail)")
        case .responseTooLarge(let limit):
            (.upstreamResponseTooLarge, "upstream \(upstream) sent a body over the limit of \(limit) bytes")
        case .protocolError(let detail):
            (.upstreamProtocolError, "upstream \(upstream): \(detail)")
        case .tls(let detail):
            (.upstreamTLSError, "upstream \(upstream): TLS: \(detail)")
        case .certificatePinMismatch:
            (.upstreamTLSPinMismatch, "upstream \(upstream): TLS: \(SPKIPins.mismatchDescription)")
        }
        return GatewayError(kind, message: message, cause: self)
    }

    /// A connect failure names the address it could not reach: `connection refused (127.0.0.1:18000)`.
    func reaching(_ authority: String) -> UpstreamError {
        guard case .connectFailed(let detail) = self else { return self }
        return .connectFailed("\(detail) (\(authority))")
    }
}

extension UpstreamError {
    /// One log line per failed exchange. TLS failures are errors: they mean broken trust or
    /// configuration, not a transient fault, and the line says which upstream and what failed.
    func log(upstream: String, to logger: Logger) {
        switch self {
        case .tls(let detail):
            logger.error("upstream TLS failure", metadata: ["upstream": "\(upstream)", "tls_error": "\(detail)"])
        case .certificatePinMismatch:
            logger.error("upstream TLS failure", metadata: ["upstream": "\(upstream)", "tls_error": "\(SPKIPins.mismatchDescription)"])
        default:
            logger.debug("upstream exchange failed", metadata: ["upstream": "\(upstream)", "error": "\(self)"])
        }
    }
}
