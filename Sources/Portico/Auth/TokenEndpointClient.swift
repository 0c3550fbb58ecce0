import Foundation
import Synchronization
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

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

/// OAuth2 token calls (RFC 6749 §4.4 client credentials, §6 refresh) through URLSession.
///
/// Each call runs as a delegate-driven data task: on Linux a 401 carrying
/// `WWW-Authenticate: Basic` (what an IdP sends for a bad client secret) otherwise hangs
/// the task forever, so the challenge is refused and the call completes with the 401 already
/// received. Redirects are not followed, so the secret never travels to another host.
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

/// `application/x-www-form-urlencoded` (WHATWG URL §5): everything but ALPHA, DIGIT and `*-._`
/// is percent-encoded, space becomes `+`.
public enum FormEncoding {
    public static func encode(_ value: String) -> String {
        var out = ""
        out.reserveCapacity(value.utf8.count)
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "*"), UInt8(ascii: "-"),
                 UInt8(ascii: "."), UInt8(ascii: "_"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            case UInt8(ascii: " "):
                out.append("+")
            default:
                let hex = String(byte, radix: 16, uppercase: true)
                out.append(byte < 16 ? "%0" + hex : "%" + hex)
            }
        }
        return out
    }

    public static func encode(_ pairs: [(String, String)]) -> String {
        pairs.map { encode($0.0) + "=" + encode($0.1) }.joined(separator: "&")
    }

    /// The inverse, for the test token endpoint: `+` is a space, bad escapes stay as they are.
    public static func decode(_ value: Substring) -> String {
        var bytes: [UInt8] = []
        var iterator = Array(value.utf8)[...]
        while let byte = iterator.popFirst() {
            if byte == UInt8(ascii: "+") {
                bytes.append(UInt8(ascii: " "))
            } else if byte == UInt8(ascii: "%"), iterator.count >= 2,
                      let high = hexValue(iterator[iterator.startIndex]),
                      let low = hexValue(iterator[iterator.startIndex + 1]) {
                bytes.append(high << 4 | low)
                iterator = iterator.dropFirst(2)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// `a=1&b=2` as ordered pairs.
    public static func decodePairs(_ body: String) -> [(String, String)] {
        body.split(separator: "&", omittingEmptySubsequences: true).map { part in
            if let equals = part.firstIndex(of: "=") {
                return (decode(part[..<equals]), decode(part[part.index(after: equals)...]))
            }
            return (decode(part), "")
        }
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

/// How one token call travels: URLSession (the default) or AsyncHTTPClient (`transport: nio`,
/// for custom CAs, client certificates and the other TLS settings URLSession on Linux lacks).
protocol TokenTransport: Sendable {
    /// Sends the POST and returns the status and body (at most the transport's limit).
    func post(_ request: URLRequest) async throws(TokenEndpointError) -> (Int, Data)
    /// Cancels calls in flight and releases connections; safe to call more than once.
    func shutdown()
}

/// Token calls through URLSession, driven by `TokenSessionDelegate`.
final class URLSessionTokenTransport: TokenTransport {
    /// `nil` once shut down: URLSession traps on a task made after `invalidateAndCancel`, and a
    /// token refresh can race a shutdown, so tasks are made and the session invalidated under one lock.
    private let session: Mutex<URLSession?>
    private let delegate: TokenSessionDelegate

    init(backstopSeconds: Int, limit: Int) {
        let configuration = URLSessionConfiguration.portico(backstopSeconds: backstopSeconds)
        let delegate = TokenSessionDelegate(limit: limit)
        self.delegate = delegate
        session = Mutex(URLSession(configuration: configuration, delegate: delegate, delegateQueue: nil))
    }

    func post(_ request: URLRequest) async throws(TokenEndpointError) -> (Int, Data) {
        guard let task = session.withLock({ $0?.dataTask(with: request) }) else {
            throw TokenEndpointError(.transport("the credential was shut down"))
        }
        return try await delegate.perform(task)
    }

    func shutdown() {
        session.withLock { session in
            session?.invalidateAndCancel()
            session = nil
        }
    }
}

/// Routes URLSession's delegate callbacks to the call waiting on each task.
///
/// Sendable: its only state is behind a `Mutex`; URLSession calls it from its own queue.
final class TokenSessionDelegate: NSObject, URLSessionDataDelegate, Sendable {
    private struct Call {
        var continuation: CheckedContinuation<(Int, Data), any Error>?
        var status: Int?
        var data = Data()
    }

    private struct State {
        var calls: [Int: Call] = [:]
        /// Tasks cancelled before their continuation was registered.
        var cancelledEarly: Set<Int> = []
    }

    private let state = Mutex(State())
    private let limit: Int

    init(limit: Int) {
        self.limit = limit
    }

    /// Runs `request` and returns the status and body; cancellation cancels the task at once.
    func perform(_ task: URLSessionDataTask) async throws(TokenEndpointError) -> (Int, Data) {
        let id = task.taskIdentifier
        do {
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<(Int, Data), any Error>) in
                    let cancelled = state.withLock { state -> Bool in
                        if state.cancelledEarly.remove(id) != nil { return true }
                        state.calls[id] = Call(continuation: continuation)
                        return false
                    }
                    if cancelled {
                        continuation.resume(throwing: CancellationError())
                    } else {
                        task.resume()
                    }
                }
            } onCancel: {
                task.cancel()
                self.finish(id, with: .failure(CancellationError()), markIfAbsent: true)
            }
        } catch let error as TokenEndpointError {
            throw error
        } catch is CancellationError {
            throw TokenEndpointError(.timeout)
        } catch let error as URLError {
            // On Linux a TLS failure is URLError -1 with curl's message, reduced to its reason.
            if let tls = TLSFailure.describe(curlMessage: error.localizedDescription) {
                throw TokenEndpointError(.transport("TLS failure: \(tls)"))
            }
            // The code only: URLError's description can carry the token URL.
            throw TokenEndpointError(.transport(Self.describe(error.code)))
        } catch {
            throw TokenEndpointError(.transport("request failed"))
        }
    }

    private func finish(_ id: Int, with result: Result<(Int, Data), any Error>, markIfAbsent: Bool = false) {
        let continuation = state.withLock { state -> CheckedContinuation<(Int, Data), any Error>? in
            guard var call = state.calls[id] else {
                if markIfAbsent { state.cancelledEarly.insert(id) }
                return nil
            }
            let continuation = call.continuation
            call.continuation = nil
            state.calls[id] = nil
            return continuation
        }
        continuation?.resume(with: result)
    }

    /// What was received so far, as a result (when a status line arrived).
    private func received(_ id: Int) -> (Int, Data)? {
        state.withLock { state in
            guard let call = state.calls[id], let status = call.status else { return nil }
            return (status, call.data)
        }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        state.withLock { $0.calls[dataTask.taskIdentifier]?.status = status }
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        let id = dataTask.taskIdentifier
        let tooLarge = state.withLock { state -> Bool in
            guard state.calls[id] != nil else { return false }
            state.calls[id]!.data.append(data)
            return state.calls[id]!.data.count > limit
        }
        if tooLarge {
            finish(id, with: .failure(TokenEndpointError(.malformed("response larger than \(limit) bytes"))))
            dataTask.cancel()
        }
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didReceive challenge: URLAuthenticationChallenge,
                    completionHandler: @escaping @Sendable (URLSession.AuthChallengeDisposition, URLCredential?) -> Void) {
        // The 401 and its body have been delivered already: keep them and refuse the
        // challenge (answering it would hang the task on Linux).
        let id = task.taskIdentifier
        if let answer = received(id) {
            finish(id, with: .success(answer))
        }
        completionHandler(.cancelAuthenticationChallenge, nil)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                    newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void) {
        completionHandler(nil)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        let id = task.taskIdentifier
        if let error {
            finish(id, with: .failure(error))
        } else {
            finish(id, with: received(id).map { .success($0) } ?? .failure(URLError(.badServerResponse)))
        }
    }

    static func describe(_ code: URLError.Code) -> String {
        switch code {
        case .cannotConnectToHost: "connection refused"
        case .timedOut: "timed out"
        case .networkConnectionLost: "connection lost"
        case .cannotFindHost, .dnsLookupFailed: "host not found"
        case .notConnectedToInternet: "network unreachable"
        case .secureConnectionFailed, .serverCertificateUntrusted, .serverCertificateHasBadDate,
             .serverCertificateNotYetValid, .serverCertificateHasUnknownRoot, .clientCertificateRejected:
            "TLS failure"
        case .badServerResponse: "bad response"
        default: "URLError \(code.rawValue)"
        }
    }
}
