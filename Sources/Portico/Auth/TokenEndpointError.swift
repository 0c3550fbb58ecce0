/// A failed token call. Carries the HTTP status and the OAuth `error` code, never the
/// client secret, a token or the raw response body: the description ends up in 503 messages.
public struct TokenEndpointError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// The endpoint answered with a non-2xx status (and maybe an OAuth `error` code).
        case http(status: Int, oauthError: String?)
        /// 2xx, but not a usable token response.
        case malformed(String)
        /// No answer: connection refused, reset, DNS…
        case transport(String)
        /// No answer within the credential's timeout.
        case timeout
        /// The grant needs a refresh token and none is known.
        case noRefreshToken
    }

    public var kind: Kind

    public init(_ kind: Kind) {
        self.kind = kind
    }

    public var description: String {
        switch kind {
        case .http(let status, let oauthError):
            if let oauthError { return "token endpoint answered HTTP \(status) (\(oauthError))" }
            return "token endpoint answered HTTP \(status)"
        case .malformed(let detail): return "token endpoint sent a malformed token response: \(detail)"
        case .transport(let detail): return "token endpoint unreachable: \(detail)"
        case .timeout: return "token endpoint did not answer in time"
        case .noRefreshToken: return "no refresh token is available"
        }
    }
}
