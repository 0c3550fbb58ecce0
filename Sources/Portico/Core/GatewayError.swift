import HTTPTypes
import NIOCore

/// Every failure the gateway reports to a client: one JSON shape,
/// `{"error":"upstream_timeout","message":"…","request_id":"…"}`, with the right status.
///
/// What happened is its `kind`, a closed set from which the status and the JSON `error` code
/// derive; retry, metrics and the access log switch on it. The message is for people and may
/// be reworded freely. The `cause` (an `UpstreamError`, a token endpoint failure) is kept for
/// logs and never sent to the client.
public struct GatewayError: Error, Sendable, Equatable, CustomStringConvertible {
    public let kind: Kind
    /// A human-readable message. Never contains secrets.
    public var message: String
    /// Extra response headers (`Allow`, `Retry-After`, …).
    public var headerFields: HTTPFields
    /// What led to this failure, for logs only.
    public var cause: (any Error & Sendable)?

    public init(_ kind: Kind, message: String, headerFields: HTTPFields = [:], cause: (any Error & Sendable)? = nil) {
        self.kind = kind
        self.message = message
        self.headerFields = headerFields
        self.cause = cause
    }

    public var status: HTTPResponse.Status { kind.status }
    /// The stable machine-readable code clients see (`upstream_timeout`, `not_found`, …).
    public var code: String { kind.code }

    public var description: String { "\(status.code) \(code): \(message)" }

    /// Equal when kind, message and headers are: the cause is for logs.
    public static func == (lhs: GatewayError, rhs: GatewayError) -> Bool {
        lhs.kind == rhs.kind && lhs.message == rhs.message && lhs.headerFields == rhs.headerFields
    }

    /// The response a client sees for this error.
    public func response(requestID: String) -> GatewayResponse {
        var fields = headerFields
        fields[.contentType] = "application/json"
        fields[.cacheControl] = fields[.cacheControl] ?? "no-store"
        return GatewayResponse(status: status, headerFields: fields,
                               body: Body(string: Self.json(code: code, message: message, requestID: requestID)))
    }

    /// The one JSON error body: `{"error":…,"message":…,"request_id":…}` and a newline.
    static func json(code: String, message: String, requestID: String) -> String {
        var json = "{\"error\":"
        JSON.appendString(code, to: &json)
        json += ",\"message\":"
        JSON.appendString(message, to: &json)
        json += ",\"request_id\":"
        JSON.appendString(requestID, to: &json)
        json += "}\n"
        return json
    }
}

extension GatewayError {
    /// What went wrong, from the closed set the gateway knows. Compared with `==`, shown by
    /// `name`; new kinds can be added without breaking callers that switch on the ones they know.
    public struct Kind: Hashable, Sendable, CustomStringConvertible {
        private enum Code: String, Hashable, Sendable {
            case badRequest = "bad_request"
            case notFound = "not_found"
            case methodNotAllowed = "method_not_allowed"
            case payloadTooLarge = "payload_too_large"
            case headersTooLarge = "request_header_fields_too_large"
            case notImplemented = "not_implemented"
            case requestTimeout = "request_timeout"
            case rateLimited = "rate_limited"
            case rateLimitKeyMissing = "rate_limit_key_missing"
            case quotaExhausted = "quota_exhausted"
            case providerExhausted = "provider_exhausted"
            case notCached = "not_cached"
            case overloaded
            case upstreamOverloaded = "upstream_overloaded"
            case shuttingDown = "shutting_down"
            case credentialsUnavailable = "credentials_unavailable"
            case upstreamConnectFailed = "upstream_connect_failed"
            case upstreamConnectionClosed = "upstream_connection_closed"
            case upstreamConnectTimeout = "upstream_connect_timeout"
            case upstreamTimeout = "upstream_timeout"
            case upstreamResponseTooLarge = "upstream_response_too_large"
            case upstreamProtocolError = "upstream_protocol_error"
            case upstreamTLSError = "upstream_tls_error"
            case upstreamTLSPinMismatch = "upstream_tls_pin_mismatch"
            case responseHeadTooLarge = "response_head_too_large"
            case internalError = "internal_error"
            case clientClosedRequest = "client_closed_request"
        }

        private let value: Code
        private init(_ value: Code) { self.value = value }

        /// 400: the request is malformed.
        public static let badRequest = Kind(.badRequest)
        /// 404: no route matches.
        public static let notFound = Kind(.notFound)
        /// 405: a route matches the path but not the method.
        public static let methodNotAllowed = Kind(.methodNotAllowed)
        /// 413: the request body is over `max_body_bytes`.
        public static let payloadTooLarge = Kind(.payloadTooLarge)
        /// 431: the request head is over `max_header_bytes`.
        public static let headersTooLarge = Kind(.headersTooLarge)
        /// 501: a transfer coding other than chunked.
        public static let notImplemented = Kind(.notImplemented)
        /// 504: the request was not answered within its own deadline.
        public static let requestTimeout = Kind(.requestTimeout)
        /// 429: the rate limit refused the request.
        public static let rateLimited = Kind(.rateLimited)
        /// 429: the upstream's own limit, learned from its responses (`provider_limits`), is
        /// spent or it asked for a pause, and the request cannot wait for it.
        public static let providerExhausted = Kind(.providerExhausted)
        /// 400: the request lacks the rate-limit key (`missing_key: reject`).
        public static let rateLimitKeyMissing = Kind(.rateLimitKeyMissing)
        /// 429: the request's allocation of a `quota` is spent for the current calendar window.
        public static let quotaExhausted = Kind(.quotaExhausted)
        /// 504: `only-if-cached` and nothing stored answers.
        public static let notCached = Kind(.notCached)
        /// 503: too many requests in flight.
        public static let overloaded = Kind(.overloaded)
        /// 503: the upstream's circuit breaker refused the request (`max_requests` in flight or
        /// `max_pending` waiting for a connection).
        public static let upstreamOverloaded = Kind(.upstreamOverloaded)
        /// 503: the gateway is shutting down.
        public static let shuttingDown = Kind(.shuttingDown)
        /// 503: no valid credential for the upstream.
        public static let credentialsUnavailable = Kind(.credentialsUnavailable)
        /// 502 `upstream_unavailable`: no connection (refused, unreachable, name not found).
        public static let upstreamConnectFailed = Kind(.upstreamConnectFailed)
        /// 502 `upstream_unavailable`: the connection closed before the response was complete.
        public static let upstreamConnectionClosed = Kind(.upstreamConnectionClosed)
        /// 504 `upstream_timeout`: no connection within `connect_timeout` (like nginx).
        public static let upstreamConnectTimeout = Kind(.upstreamConnectTimeout)
        /// 504: the exchange did not finish within its deadline.
        public static let upstreamTimeout = Kind(.upstreamTimeout)
        /// 502: the response body is over `max_response_bytes`.
        public static let upstreamResponseTooLarge = Kind(.upstreamResponseTooLarge)
        /// 502: the upstream's answer is not valid HTTP.
        public static let upstreamProtocolError = Kind(.upstreamProtocolError)
        /// 502: the TLS handshake with the upstream failed. Never retried.
        public static let upstreamTLSError = Kind(.upstreamTLSError)
        /// 502 `upstream_tls_error`: the upstream's key matches none of `tls.pin_sha256`. Never retried.
        public static let upstreamTLSPinMismatch = Kind(.upstreamTLSPinMismatch)
        /// 502: the response head does not fit in the connection's memory.
        public static let responseHeadTooLarge = Kind(.responseHeadTooLarge)
        /// 500: a failure the gateway did not expect.
        public static let internalError = Kind(.internalError)
        /// The client went away before its response was complete (nginx's 499; never sent).
        public static let clientClosedRequest = Kind(.clientClosedRequest)

        /// The response status.
        public var status: HTTPResponse.Status {
            switch value {
            case .badRequest, .rateLimitKeyMissing: .badRequest
            case .notFound: .notFound
            case .methodNotAllowed: .methodNotAllowed
            case .payloadTooLarge: .contentTooLarge
            case .headersTooLarge: .requestHeaderFieldsTooLarge
            case .notImplemented: .notImplemented
            case .rateLimited, .quotaExhausted, .providerExhausted: .tooManyRequests
            case .requestTimeout, .notCached, .upstreamConnectTimeout, .upstreamTimeout: .gatewayTimeout
            case .overloaded, .upstreamOverloaded, .shuttingDown, .credentialsUnavailable: .serviceUnavailable
            case .upstreamConnectFailed, .upstreamConnectionClosed, .upstreamResponseTooLarge, .upstreamProtocolError,
                 .upstreamTLSError, .upstreamTLSPinMismatch, .responseHeadTooLarge: .badGateway
            case .internalError: .internalServerError
            case .clientClosedRequest: HTTPResponse.Status(code: 499, reasonPhrase: "Client Closed Request")
            }
        }

        /// The JSON `error` code clients see. Kinds a client need not tell apart share one:
        /// a refused connection and a reset are both `upstream_unavailable`, a connect timeout
        /// is an `upstream_timeout`.
        public var code: String {
            switch value {
            case .upstreamConnectFailed, .upstreamConnectionClosed: "upstream_unavailable"
            case .upstreamConnectTimeout: "upstream_timeout"
            case .upstreamTLSPinMismatch: "upstream_tls_error"
            default: value.rawValue
            }
        }

        /// The kind's own name, the finest distinction: the access log's `error` field and the
        /// `kind` label of `portico_upstream_errors_total`.
        public var name: String { value.rawValue }

        public var description: String { name }
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
        GatewayError(.badRequest, message: message)
    }
    public static func notFound(path: Substring) -> GatewayError {
        GatewayError(.notFound, message: "no route matches \(String(path).prefix(200))")
    }
    public static func methodNotAllowed(_ method: HTTPRequest.Method, allow: [String]) -> GatewayError {
        var fields = HTTPFields()
        fields[.allow] = allow.joined(separator: ", ")
        return GatewayError(.methodNotAllowed, message: "method \(method.rawValue) is not allowed here", headerFields: fields)
    }
    public static func requestTimeout(_ message: String = "the request did not complete within its deadline") -> GatewayError {
        GatewayError(.requestTimeout, message: message)
    }
    /// The gateway holds no valid credential for the upstream (identity provider down or
    /// refusing). `detail` must never carry a secret or a token.
    public static func credentialsUnavailable(_ credential: String, _ detail: String,
                                              cause: (any Error & Sendable)? = nil) -> GatewayError {
        GatewayError(.credentialsUnavailable, message: "credential \(credential): \(detail)", cause: cause)
    }
    /// 503 at once when too many requests are in flight (overall or on `route`).
    public static func overloaded(route: String?) -> GatewayError {
        var fields = HTTPFields()
        fields[.retryAfter] = "1"
        let scope = route.map { "on route \($0)" } ?? "in the gateway"
        return GatewayError(.overloaded, message: "too many requests in flight \(scope); retry later", headerFields: fields)
    }
    /// 429 with `Retry-After` in whole seconds (at least 1, as clients round 0 to "now").
    public static func rateLimited(retryAfter: Duration, headerFields: HTTPFields = [:]) -> GatewayError {
        var fields = headerFields
        fields[.retryAfter] = String(max(1, wholeSecondsRoundedUp(retryAfter)))
        return GatewayError(.rateLimited, message: "rate limit exceeded; retry later", headerFields: fields)
    }
    /// 429 when the upstream's learned limit is spent (`provider_limits`); `Retry-After` in whole seconds.
    public static func providerExhausted(upstream: String, retryAfter: Duration) -> GatewayError {
        var fields = HTTPFields()
        fields[.retryAfter] = String(max(1, wholeSecondsRoundedUp(retryAfter)))
        return GatewayError(.providerExhausted, message: "upstream \(upstream) is at its own rate limit; retry later",
                            headerFields: fields)
    }
    /// 400 for a request that lacks the rate-limit key (`missing_key: reject`).
    public static func rateLimitKeyMissing(_ what: String) -> GatewayError {
        GatewayError(.rateLimitKeyMissing, message: "the request has no \(what)")
    }
    /// 429 for a spent quota allocation. `retryAfter`: until the window ends (whole seconds, at
    /// least 1); `nil` when waiting cannot help (an allocation of 0).
    public static func quotaExhausted(_ message: String, retryAfter: Duration?, headerFields: HTTPFields = [:]) -> GatewayError {
        var fields = headerFields
        if let retryAfter { fields[.retryAfter] = String(max(1, wholeSecondsRoundedUp(retryAfter))) }
        return GatewayError(.quotaExhausted, message: message, headerFields: fields)
    }
    public static func internalError(_ message: String = "internal error") -> GatewayError {
        GatewayError(.internalError, message: message)
    }
    /// The client closed its connection before the exchange was over.
    public static func clientClosedRequest() -> GatewayError {
        GatewayError(.clientClosedRequest, message: "the client closed the connection")
    }
}

/// Seconds, rounded up: a client told to wait 0 s after a refusal would retry at once.
func wholeSecondsRoundedUp(_ duration: Duration) -> Int {
    let (seconds, attoseconds) = duration.components
    if seconds < 0 { return 0 }
    return Int(seconds) + (attoseconds > 0 ? 1 : 0)
}
