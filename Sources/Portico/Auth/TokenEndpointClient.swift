import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// OAuth2 token calls (RFC 6749 §4.4 client credentials, §6 refresh) through URLSession
/// (`URLSessionTokenTransport`) or Portico's connection pool on SwiftNIO (`NIOTokenTransport`).
///
/// On URLSession each call runs as a delegate-driven data task (`URLSessionBridge`): on Linux
/// a 401 carrying `WWW-Authenticate: Basic` (what an IdP sends for a bad client secret)
/// otherwise hangs the task forever, so the challenge is refused and the call completes with
/// the 401 already received. Redirects are not followed, so the secret never travels to another host.
public final class TokenEndpointClient: Sendable {
    public enum Grant: Sendable, Equatable {
        case clientCredentials
        case refreshToken
    }

    public let config: OAuth2Config
    /// The grant `fetch(refreshToken:)` uses.
    public let grant: Grant
    /// Backstop for URLSession; the token manager enforces the real timeout on its clock.
    public let timeout: Duration
    private let transport: any TokenTransport

    /// Token responses beyond this size are refused (a token response is a few hundred bytes).
    static let maxResponseBytes = 64 * 1024

    public init(config: OAuth2Config, grant: Grant = .clientCredentials, timeout: Duration = .seconds(10)) {
        self.config = config
        self.grant = grant
        self.timeout = timeout
        // URLSession counts whole seconds only; one more than the credential timeout.
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        let backstopSeconds = Int(seconds.rounded(.up)) + 1
        switch config.transport {
        case .urlsession:
            transport = URLSessionTokenTransport(backstopSeconds: backstopSeconds, limit: Self.maxResponseBytes)
        case .nio:
            transport = NIOTokenTransport(tokenURL: config.tokenURL, tls: config.tls, timeout: timeout,
                                          limit: Self.maxResponseBytes)
        }
    }

    deinit {
        transport.shutdown()
    }

    /// RFC 6749 §4.4: `grant_type=client_credentials`, with the configured scope, audience and extras.
    public func clientCredentials() async throws(TokenEndpointError) -> TokenResponse {
        var form: [(String, String)] = [("grant_type", "client_credentials")]
        if let scope = config.scope { form.append(("scope", scope)) }
        if let audience = config.audience { form.append(("audience", audience)) }
        return try await call(form)
    }

    /// RFC 6749 §6: `grant_type=refresh_token`. The answer may carry a rotated refresh token.
    public func refresh(refreshToken: String) async throws(TokenEndpointError) -> TokenResponse {
        var form: [(String, String)] = [("grant_type", "refresh_token"), ("refresh_token", refreshToken)]
        if let scope = config.scope { form.append(("scope", scope)) }
        return try await call(form)
    }

    private func call(_ parameters: [(String, String)]) async throws(TokenEndpointError) -> TokenResponse {
        var form = parameters
        for key in config.extraParams.keys.sorted() where !form.contains(where: { $0.0 == key }) {
            form.append((key, config.extraParams[key]!))
        }
        var request = URLRequest(url: config.tokenURL)
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        request.setValue("portico/\(PorticoVersion.string)", forHTTPHeaderField: "User-Agent")
        switch config.clientAuth {
        case .clientSecretBasic:
            // §2.3.1: id and secret are form-urlencoded before being joined and base64-encoded.
            let pair = FormEncoding.encode(config.clientID) + ":" + FormEncoding.encode(config.clientSecret)
            request.setValue("Basic " + Data(pair.utf8).base64EncodedString(), forHTTPHeaderField: "Authorization")
        case .clientSecretPost:
            form.append(("client_id", config.clientID))
            form.append(("client_secret", config.clientSecret))
        }
        request.httpBody = Data(FormEncoding.encode(form).utf8)

        let (status, body) = try await transport.post(request)
        guard (200..<300).contains(status) else {
            throw TokenEndpointError(.http(status: status, oauthError: Self.oauthErrorCode(in: body)))
        }
        return try Self.parse(body)
    }

    /// Cancels calls in flight and releases the session (it retains its delegate until then).
    public func shutdown() {
        transport.shutdown()
    }

    /// Parses a successful token response (RFC 6749 §5.1).
    package static func parse(_ body: Data) throws(TokenEndpointError) -> TokenResponse {
        let wire: WireResponse
        do {
            wire = try JSONDecoder().decode(WireResponse.self, from: body)
        } catch {
            throw TokenEndpointError(.malformed("not a JSON object with the expected fields"))
        }
        guard let accessToken = wire.access_token, !accessToken.isEmpty else {
            throw TokenEndpointError(.malformed("no access_token"))
        }
        guard accessToken.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            // It goes into a header field: control bytes or spaces would corrupt the request.
            throw TokenEndpointError(.malformed("access_token has characters not allowed in a header"))
        }
        var tokenType = wire.token_type ?? "Bearer"
        if tokenType.lowercased() == "bearer" { tokenType = "Bearer" }
        guard !tokenType.isEmpty, tokenType.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw TokenEndpointError(.malformed("token_type is not a single word"))
        }
        var expiresIn: Duration?
        if let seconds = wire.expires_in?.value {
            guard seconds.isFinite, seconds > 0, seconds < 10 * 365 * 86_400 else {
                throw TokenEndpointError(.malformed("expires_in is not a positive number of seconds"))
            }
            expiresIn = .milliseconds(Int64((seconds * 1000).rounded()))
        }
        let refreshToken = wire.refresh_token.flatMap { $0.isEmpty ? nil : $0 }
        return TokenResponse(accessToken: accessToken, tokenType: tokenType, expiresIn: expiresIn, refreshToken: refreshToken)
    }

    /// Registered OAuth error codes (RFC 6749 §4.1.2.1 and §5.2, RFC 8707, RFC 8693).
    static let knownErrorCodes: Set<String> = [
        "invalid_request", "invalid_client", "invalid_grant", "unauthorized_client", "unsupported_grant_type",
        "invalid_scope", "server_error", "temporarily_unavailable", "access_denied", "invalid_target",
        "invalid_token", "insufficient_scope", "unsupported_token_type",
    ]

    /// The OAuth `error` code of an error response. Only registered codes are kept: an
    /// arbitrary string from the IdP could echo anything (even the secret), so it is never copied.
    static func oauthErrorCode(in body: Data) -> String? {
        guard let wire = try? JSONDecoder().decode(WireError.self, from: body), let code = wire.error else { return nil }
        return knownErrorCodes.contains(code) ? code : "unregistered error code"
    }

    // Field names as on the wire (RFC 6749 §5.1).
    private struct WireResponse: Decodable {
        var access_token: String?
        var token_type: String?
        var expires_in: FlexibleNumber?
        var refresh_token: String?
    }

    private struct WireError: Decodable {
        var error: String?
    }

    /// `expires_in` as a number or a numeric string (both are seen in the wild).
    private struct FlexibleNumber: Decodable {
        var value: Double?
        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if container.decodeNil() {
                value = nil
            } else if let number = try? container.decode(Double.self) {
                value = number
            } else {
                let text = try container.decode(String.self)
                guard let number = Double(text.trimmingCharacters(in: .whitespaces)) else {
                    throw DecodingError.dataCorruptedError(in: container, debugDescription: "expires_in")
                }
                value = number
            }
        }
    }
}
