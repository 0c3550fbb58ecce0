import HTTPTypes
import NIOCore

/// Every failure the gateway reports to a client: one JSON shape,
/// `{"error":"upstream_timeout","message":"…","request_id":"…"}`, with the right status.
public struct GatewayError: Error, Sendable, Equatable, CustomStringConvertible {
    public var status: HTTPResponse.Status
    /// A stable machine-readable code (`upstream_timeout`, `not_found`, …).
    public var code: String
    /// A human-readable message. Never contains secrets.
    public var message: String
    /// Extra response headers (`Allow`, `Retry-After`, …).
    public var headerFields: HTTPFields

    public init(status: HTTPResponse.Status, code: String, message: String, headerFields: HTTPFields = [:]) {
        self.status = status
        self.code = code
        self.message = message
        self.headerFields = headerFields
    }

    public var description: String { "\(status.code) \(code): \(message)" }

    /// The response a client sees for this error.
    public func response(requestID: String) -> GatewayResponse {
        var json = "{\"error\":"
        JSON.appendString(code, to: &json)
        json += ",\"message\":"
        JSON.appendString(message, to: &json)
        json += ",\"request_id\":"
        JSON.appendString(requestID, to: &json)
        json += "}\n"
        var fields = headerFields
        fields[.contentType] = "application/json"
        fields[.cacheControl] = fields[.cacheControl] ?? "no-store"
        return GatewayResponse(status: status, headerFields: fields, body: Body(string: json))
    }
}

extension GatewayError {
    /// What a client is answered when a chain throws `error`: a `GatewayError` as it is, a
    /// cancelled task (its deadline passed) `504 request_timeout`, anything else `500`.
    public static func answering(_ error: any Error) -> GatewayError {
        switch error {
        case let error as GatewayError: error
        case is CancellationError: .requestTimeout()
        default: .internalError()
        }
    }

    public static func badRequest(_ message: String) -> GatewayError {
        GatewayError(status: .badRequest, code: "bad_request", message: message)
    }
    public static func notFound(path: Substring) -> GatewayError {
        GatewayError(status: .notFound, code: "not_found", message: "no route matches \(String(path).prefix(200))")
    }
    public static func methodNotAllowed(_ method: HTTPRequest.Method, allow: [String]) -> GatewayError {
        var fields = HTTPFields()
        fields[.allow] = allow.joined(separator: ", ")
        return GatewayError(status: .methodNotAllowed, code: "method_not_allowed",
                            message: "method \(method.rawValue) is not allowed here", headerFields: fields)
    }
    public static func payloadTooLarge(limit: Int) -> GatewayError {
        GatewayError(status: .contentTooLarge, code: "payload_too_large",
                     message: "request body exceeds the limit of \(limit) bytes")
    }
    public static func headersTooLarge(limit: Int) -> GatewayError {
        GatewayError(status: .requestHeaderFieldsTooLarge, code: "request_header_fields_too_large",
                     message: "request head exceeds the limit of \(limit) bytes")
    }
    public static func requestTimeout(_ message: String = "the request did not complete within its deadline") -> GatewayError {
        GatewayError(status: .gatewayTimeout, code: "request_timeout", message: message)
    }
    public static func upstreamUnavailable(_ upstream: String, _ detail: String) -> GatewayError {
        GatewayError(status: .badGateway, code: "upstream_unavailable", message: "upstream \(upstream): \(detail)")
    }
    public static func upstreamTimeout(_ upstream: String) -> GatewayError {
        GatewayError(status: .gatewayTimeout, code: "upstream_timeout",
                     message: "upstream \(upstream) did not answer within the deadline")
    }
    public static func upstreamConnectTimeout(_ upstream: String) -> GatewayError {
        GatewayError(status: .gatewayTimeout, code: "upstream_timeout",
                     message: "upstream \(upstream): no connection within the connect timeout")
    }
    public static func upstreamResponseTooLarge(_ upstream: String, limit: Int) -> GatewayError {
        GatewayError(status: .badGateway, code: "upstream_response_too_large",
                     message: "upstream \(upstream) sent a body over the limit of \(limit) bytes")
    }
    public static func upstreamProtocolError(_ upstream: String, _ detail: String) -> GatewayError {
        GatewayError(status: .badGateway, code: "upstream_protocol_error", message: "upstream \(upstream): \(detail)")
    }
    /// The TLS handshake with the upstream failed (untrusted or expired certificate, wrong host
    /// name, refused client certificate…). Never retried over plain HTTP.
    public static func upstreamTLSError(_ upstream: String, _ detail: String) -> GatewayError {
        GatewayError(status: .badGateway, code: "upstream_tls_error", message: "upstream \(upstream): TLS: \(detail)")
    }
    /// The gateway holds no valid credential for the upstream (identity provider down or
    /// refusing). `detail` must never carry a secret or a token.
    public static func credentialsUnavailable(_ credential: String, _ detail: String) -> GatewayError {
        GatewayError(status: .serviceUnavailable, code: "credentials_unavailable",
                     message: "credential \(credential): \(detail)")
    }
    /// 503 at once when too many requests are in flight (overall or on `route`).
    public static func overloaded(route: String?) -> GatewayError {
        var fields = HTTPFields()
        fields[.retryAfter] = "1"
        let scope = route.map { "on route \($0)" } ?? "in the gateway"
        return GatewayError(status: .serviceUnavailable, code: "overloaded",
                            message: "too many requests in flight \(scope); retry later", headerFields: fields)
    }
    /// 429 with `Retry-After` in whole seconds (at least 1, as clients round 0 to "now").
    public static func rateLimited(retryAfter: Duration, headerFields: HTTPFields = [:]) -> GatewayError {
        var fields = headerFields
        fields[.retryAfter] = String(max(1, wholeSecondsRoundedUp(retryAfter)))
        return GatewayError(status: .tooManyRequests, code: "rate_limited",
                            message: "rate limit exceeded; retry later", headerFields: fields)
    }
    /// 400 for a request that lacks the rate-limit key (`missing_key: reject`).
    public static func rateLimitKeyMissing(_ what: String) -> GatewayError {
        GatewayError(status: .badRequest, code: "rate_limit_key_missing", message: "the request has no \(what)")
    }
    public static func internalError(_ message: String = "internal error") -> GatewayError {
        GatewayError(status: .internalServerError, code: "internal_error", message: message)
    }
    public static let shuttingDown = GatewayError(status: .serviceUnavailable, code: "shutting_down",
                                                  message: "the gateway is shutting down")
}

/// Seconds, rounded up: a client told to wait 0 s after a refusal would retry at once.
func wholeSecondsRoundedUp(_ duration: Duration) -> Int {
    let (seconds, attoseconds) = duration.components
    if seconds < 0 { return 0 }
    return Int(seconds) + (attoseconds > 0 ? 1 : 0)
}

/// Minimal JSON string escaping for the error body and log lines.
enum JSON {
    static func appendString(_ string: String, to out: inout String) {
        out.append("\"")
        for scalar in string.unicodeScalars {
            switch scalar {
            case "\"": out.append("\\\"")
            case "\\": out.append("\\\\")
            case "\n": out.append("\\n")
            case "\r": out.append("\\r")
            case "\t": out.append("\\t")
            case _ where scalar.value < 0x20 || scalar.value == 0x7F:
                let hex = String(scalar.value, radix: 16)
                out.append("\\u" + String(repeating: "0", count: 4 - hex.count) + hex)
            default: out.unicodeScalars.append(scalar)
            }
        }
        out.append("\"")
    }
}
