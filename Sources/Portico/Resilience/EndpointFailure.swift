/// Why an exchange counts against the endpoint that served it: a closed set, from the
/// transport's error kind or the response status alone (never from wording).
///
/// Counted: connection refused or failed, a reset, a timeout, an answer that is not HTTP, and
/// 502/503/504 (every 5xx with `failures: 5xx`). Never counted: a 4xx, and the client leaving
/// (its task cancelled, `client_closed_request`): neither says anything about the endpoint.
public enum EndpointFailure: UInt8, Sendable, Equatable, CaseIterable, CustomStringConvertible {
    case connectFailed = 1
    case reset
    case timeout
    case protocolError
    /// 502, 503 or 504 from the endpoint.
    case gatewayStatus
    /// Another 5xx (counted with `failures: 5xx` only).
    case serverError

    /// The `kind` label and the admin report's word.
    public var name: String {
        switch self {
        case .connectFailed: "connect_failed"
        case .reset: "reset"
        case .timeout: "timeout"
        case .protocolError: "protocol_error"
        case .gatewayStatus: "gateway_status"
        case .serverError: "server_error"
        }
    }

    public var description: String { name }

    /// A response's status, under `policy`: `nil` when it is no failure of the endpoint's.
    public init?(status: Int, policy: OutlierDetectionConfig.Failures) {
        switch status {
        case 502, 503, 504: self = .gatewayStatus
        case 500...599 where policy == .serverErrors: self = .serverError
        default: return nil
        }
    }

    /// A failed attempt: `nil` for the client leaving, a refused upload (413), a TLS failure
    /// (configuration, not a passing fault) and anything not the endpoint's doing.
    public init?(error: any Error) {
        guard let error = error as? GatewayError else { return nil }
        switch error.kind {
        case .upstreamConnectFailed: self = .connectFailed
        case .upstreamConnectionClosed: self = .reset
        case .upstreamTimeout, .upstreamConnectTimeout: self = .timeout
        case .upstreamProtocolError: self = .protocolError
        default: return nil
        }
    }
}
