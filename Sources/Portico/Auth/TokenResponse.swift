/// What a token endpoint granted. The access token and refresh token never appear in
/// `description`, so the value is safe to interpolate into a log line by accident.
public struct TokenResponse: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    public var accessToken: String
    /// As sent (`Bearer` when absent); `bearer` is normalised to `Bearer` for the header.
    public var tokenType: String
    /// `expires_in`, when the endpoint sent one.
    public var expiresIn: Duration?
    /// A (possibly rotated) refresh token, when the endpoint sent one.
    public var refreshToken: String?

    public init(accessToken: String, tokenType: String = "Bearer", expiresIn: Duration? = nil, refreshToken: String? = nil) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.expiresIn = expiresIn
        self.refreshToken = refreshToken
    }

    public var description: String {
        "TokenResponse(type: \(tokenType), expiresIn: \(expiresIn.map { "\($0)" } ?? "none"), refreshToken: \(refreshToken == nil ? "no" : "yes"))"
    }
    public var debugDescription: String { description }
}
