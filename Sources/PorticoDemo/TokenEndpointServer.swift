import Foundation
import MicroHTTPD
import Portico
import Synchronization

/// An OAuth2 token endpoint (RFC 6749 §4.4 and §6) on 127.0.0.1, port 0: the demo's IdP, and the
/// tests' (as `TestTokenEndpoint`). It checks client authentication (`client_secret_basic` or `client_secret_post`),
/// the grant, scope and audience; issues `tok-1`, `tok-2`, …; rotates refresh tokens; counts
/// calls; and can be told to fail (500, hang until released, garbage, closed port). A test
/// upstream asks `authorizes(_:)` whether a presented bearer token is current.
public final class TokenEndpointServer: Sendable {
    public enum ClientAuth: String, Sendable, Equatable {
        case basic, post, none, both
    }

    /// Scripted misbehaviour; `nil` is a well-behaved endpoint.
    public enum Failure: Sendable, Equatable {
        /// Answer with this status and an OAuth error body (`{"error":"…"}` when `error` is set).
        case status(Int, error: String? = "server_error")
        /// Hold the request until `releaseHung()` (or `stop()`).
        case hang
        /// Answer 200 with this body.
        case body(String)
        /// Stop listening: connections are refused until the failure is cleared.
        case closed

        /// 200 with something that is not JSON.
        public static let garbage = Failure.body("<html>this is not a token</html>")
    }

    public struct Configuration: Sendable {
        public var clientID = "portico"
        public var clientSecret = "test-client-secret"
        public var path = "/oauth2/token"
        /// Client authentication methods accepted.
        public var allowedClientAuth: Set<ClientAuth> = [.basic, .post]
        /// `expires_in` in issued tokens; `nil` leaves it out.
        public var expiresIn: Int? = 3600
        /// Send `expires_in` as a string (`"3600"`), as some IdPs do.
        public var expiresInAsString = false
        public var tokenType = "Bearer"
        /// When set, a `client_credentials` request must ask for exactly this scope.
        public var requiredScope: String?
        /// When set, a `client_credentials` request must name exactly this audience.
        public var requiredAudience: String?
        /// Refresh tokens the endpoint accepts from the start.
        public var refreshTokens: Set<String> = []
        /// Answer a refresh with a new refresh token and retire the old one.
        public var rotateRefreshTokens = true
        /// Answer a bad client with 401 and `WWW-Authenticate: Basic` (RFC 6749 §5.2).
        public var challengeBadClients = true

        public init() {}
    }

    /// One request the endpoint received (secrets included: it is a test double).
    public struct Received: Sendable {
        public var method: String
        public var path: String
        public var headers: [(name: String, value: String)]
        public var form: [String: String]
        public var clientAuth: ClientAuth
        /// The client id, from whichever method was used.
        public var clientID: String?
        public var clientSecret: String?
        public var grantType: String? { form["grant_type"] }
    }

    private struct State {
        var configuration: Configuration
        var failure: Failure?
        var server: HTTPServer?
        /// Holds the port while `.closed`.
        var reservation: PortReservation?
        var port: UInt16 = 0
        var received: [Received] = []
        var issued: [String] = []
        var current: Set<String> = []
        var refreshTokens: Set<String>
        var refreshCounter = 0
        var hung: [CheckedContinuation<Void, Never>] = []
        var stopped = false
    }

    private let state: Mutex<State>

    /// Starts listening at once.
    public init(_ configuration: Configuration = Configuration()) throws {
        state = Mutex(State(configuration: configuration, refreshTokens: configuration.refreshTokens))
        try listen(port: 0)
    }

    public var port: UInt16 { state.withLock { $0.port } }
    /// `http://127.0.0.1:PORT/oauth2/token`
    public var url: URL {
        let (port, path) = state.withLock { ($0.port, $0.configuration.path) }
        return URL(string: "http://127.0.0.1:\(port)\(path)")!
    }
    public var configuration: Configuration { state.withLock { $0.configuration } }

    /// Requests received (every one, including those answered with a failure).
    public var callCount: Int { state.withLock { $0.received.count } }
    public var requests: [Received] { state.withLock { $0.received } }
    /// Access tokens issued, in order.
    public var issuedTokens: [String] { state.withLock { $0.issued } }
    /// Requests currently held by `.hang`.
    public var hungCount: Int { state.withLock { $0.hung.count } }

    /// An `OAuth2Config` for this endpoint with its client id and secret.
    public func oauth2Config(clientAuth: OAuth2Config.ClientAuthMethod = .clientSecretBasic) -> OAuth2Config {
        let configuration = self.configuration
        var config = OAuth2Config(tokenURL: url, clientID: configuration.clientID, clientSecret: configuration.clientSecret)
        config.clientAuth = clientAuth
        return config
    }

    public func update(_ change: (inout Configuration) -> Void) {
        state.withLock { change(&$0.configuration) }
    }

    /// Scripts the next answers. `.closed` stops listening; clearing it listens again on the same port.
    public func setFailure(_ failure: Failure?) async throws {
        let (previous, server, port) = state.withLock { state in
            let previous = state.failure
            state.failure = failure
            return (previous, state.server, state.port)
        }
        if failure == .closed, previous != .closed {
            releaseHung()
            // Bound but not listening: connections are refused, and nothing else in the process
            // (parallel tests binding port 0) can take the port before it listens again. Reserved
            // the moment the listener closes, not after the drain (a port free that long was
            // taken by another test's server under load, which then answered the token calls).
            var reservation: PortReservation?
            await server?.stop(grace: .seconds(5), listenerClosed: { reservation = PortReservation(port: port) })
            state.withLock {
                $0.server = nil
                $0.reservation = reservation
            }
        } else if failure != .closed, previous == .closed {
            state.withLock { $0.reservation = nil }  // closes the reserving socket
            try listen(port: port)
        }
        if previous == .hang, failure != .hang {
            releaseHung()
        }
    }

    /// Lets held requests go; they are answered according to the failure then in effect.
    public func releaseHung() {
        let hung = state.withLock { state in
            defer { state.hung = [] }
            return state.hung
        }
        for continuation in hung { continuation.resume() }
    }

    /// Whether `token` was issued here and not revoked.
    public func isCurrent(_ token: String) -> Bool {
        state.withLock { $0.current.contains(token) }
    }

    /// Whether an `Authorization` value is `Bearer <current token>`.
    public func authorizes(_ authorization: String?) -> Bool {
        guard let authorization, authorization.count > 7,
              authorization.prefix(7).lowercased() == "bearer " else { return false }
        return isCurrent(String(authorization.dropFirst(7)))
    }

    public func revoke(_ token: String) {
        _ = state.withLock { $0.current.remove(token) }
    }

    public func revokeAllTokens() {
        state.withLock { $0.current.removeAll() }
    }

    /// Makes `refreshToken` acceptable for the refresh grant.
    public func addRefreshToken(_ refreshToken: String) {
        _ = state.withLock { $0.refreshTokens.insert(refreshToken) }
    }

    public func isRefreshTokenValid(_ refreshToken: String) -> Bool {
        state.withLock { $0.refreshTokens.contains(refreshToken) }
    }

    public func stop() async {
        let server = state.withLock { state in
            state.stopped = true
            defer { state.server = nil }
            return state.server
        }
        releaseHung()
        await server?.stop(grace: .seconds(5))
    }

    // MARK: - Serving

    private func listen(port: UInt16) throws {
        var configuration = ServerConfiguration()
        configuration.address = "127.0.0.1"
        configuration.port = port
        configuration.threads = 2
        configuration.requestTimeout = .seconds(600)
        let server = HTTPServer(configuration: configuration) { [weak self] request in
            guard let self else { return ServerResponse(status: 503) }
            return await self.handle(request)
        }
        let bound = try server.start()
        state.withLock { state in
            state.server = server
            state.port = bound
        }
    }

    private func handle(_ request: ServerRequest) async -> ServerResponse {
        let body = String(decoding: request.body, as: UTF8.self)
        var form: [String: String] = [:]
        for (key, value) in FormEncoding.decodePairs(body) where form[key] == nil {
            form[key] = value
        }
        let path = request.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? request.target
        var received = Received(method: request.method, path: path, headers: request.headers, form: form,
                                clientAuth: .none, clientID: nil, clientSecret: nil)
        let basic = Self.basicCredentials(request.header("authorization"))
        let posted = form["client_id"].map { ($0, form["client_secret"] ?? "") }
        switch (basic, posted) {
        case (let basic?, nil): received.clientAuth = .basic; received.clientID = basic.0; received.clientSecret = basic.1
        case (nil, let posted?): received.clientAuth = .post; received.clientID = posted.0; received.clientSecret = posted.1
        case (let basic?, _?): received.clientAuth = .both; received.clientID = basic.0; received.clientSecret = basic.1
        case (nil, nil): break
        }
        let failure = state.withLock { state in
            state.received.append(received)
            return state.failure
        }
        if failure == .hang {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.stopped || state.failure != .hang { return true }
                    state.hung.append(continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
            let after = state.withLock { $0.failure }
            if after == .hang || after == .closed {
                return Self.error(503, "temporarily_unavailable")
            }
            if let after { return Self.failureResponse(after) }
        } else if let failure {
            return Self.failureResponse(failure)
        }
        return respond(to: received, form: form, contentType: request.header("content-type"))
    }

    private static func failureResponse(_ failure: Failure) -> ServerResponse {
        switch failure {
        case .status(let status, let code):
            if let code { return error(status, code) }
            return ServerResponse(status: status, headers: [("Content-Type", "text/plain")], body: Array("failure\n".utf8))
        case .body(let body):
            return ServerResponse(status: 200, headers: [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
                                  body: Array(body.utf8))
        case .hang, .closed:
            return error(503, "temporarily_unavailable")
        }
    }

    private func respond(to request: Received, form: [String: String], contentType: String?) -> ServerResponse {
        let configuration = self.configuration
        guard request.method == "POST" else { return Self.error(405, "invalid_request") }
        guard request.path == configuration.path else { return ServerResponse(status: 404) }
        guard let contentType, contentType.lowercased().hasPrefix("application/x-www-form-urlencoded") else {
            return Self.error(400, "invalid_request")
        }
        // §2.3: exactly one client authentication method, and an allowed one.
        guard request.clientAuth != .both else { return Self.error(400, "invalid_request") }
        guard configuration.allowedClientAuth.contains(request.clientAuth),
              request.clientID == configuration.clientID, request.clientSecret == configuration.clientSecret
        else {
            var response = Self.error(401, "invalid_client")
            if configuration.challengeBadClients {
                response.headers.append(("WWW-Authenticate", "Basic realm=\"test-token-endpoint\""))
            }
            return response
        }
        switch form["grant_type"] {
        case "client_credentials":
            if let required = configuration.requiredScope, form["scope"] != required {
                return Self.error(400, "invalid_scope")
            }
            if let required = configuration.requiredAudience, form["audience"] != required {
                return Self.error(400, "invalid_target")
            }
            return issue(refreshing: nil)
        case "refresh_token":
            guard let presented = form["refresh_token"], isRefreshTokenValid(presented) else {
                return Self.error(400, "invalid_grant")
            }
            return issue(refreshing: presented)
        default:
            return Self.error(400, "unsupported_grant_type")
        }
    }

    private func issue(refreshing presented: String?) -> ServerResponse {
        let (token, refreshToken, configuration) = state.withLock { state -> (String, String?, Configuration) in
            let token = "tok-\(state.issued.count + 1)"
            state.issued.append(token)
            state.current.insert(token)
            var refreshToken: String?
            if let presented, state.configuration.rotateRefreshTokens {
                state.refreshCounter += 1
                let rotated = "rt-rotated-\(state.refreshCounter)"
                state.refreshTokens.remove(presented)
                state.refreshTokens.insert(rotated)
                refreshToken = rotated
            }
            return (token, refreshToken, state.configuration)
        }
        var json = "{\"access_token\":\"\(token)\",\"token_type\":\"\(configuration.tokenType)\""
        if let expiresIn = configuration.expiresIn {
            json += configuration.expiresInAsString ? ",\"expires_in\":\"\(expiresIn)\"" : ",\"expires_in\":\(expiresIn)"
        }
        if let refreshToken { json += ",\"refresh_token\":\"\(refreshToken)\"" }
        json += "}"
        return ServerResponse(status: 200, headers: [("Content-Type", "application/json"), ("Cache-Control", "no-store"),
                                                     ("Pragma", "no-cache")],
                              body: Array(json.utf8))
    }

    private static func error(_ status: Int, _ code: String) -> ServerResponse {
        ServerResponse(status: status, headers: [("Content-Type", "application/json"), ("Cache-Control", "no-store")],
                       body: Array("{\"error\":\"\(code)\"}".utf8))
    }

    /// `Basic base64(urlencode(id):urlencode(secret))` (RFC 6749 §2.3.1).
    private static func basicCredentials(_ header: String?) -> (String, String)? {
        guard let header, header.count > 6, header.prefix(6).lowercased() == "basic " else { return nil }
        guard let data = Data(base64Encoded: String(header.dropFirst(6)).trimmingCharacters(in: .whitespaces)) else { return nil }
        let pair = String(decoding: data, as: UTF8.self)
        guard let colon = pair.firstIndex(of: ":") else { return nil }
        return (FormEncoding.decode(pair[..<colon]), FormEncoding.decode(pair[pair.index(after: colon)...]))
    }
}

/// A socket bound to a loopback port without listening: the kernel refuses connections to the
/// port, and no other socket can bind it while this one lives.
private final class PortReservation: Sendable {
    private let descriptor: Int32

    init?(port: UInt16) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        var reuse: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &reuse, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = port.bigEndian
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard bound else {
            close(fd)
            return nil
        }
        descriptor = fd
    }

    deinit {
        close(descriptor)
    }
}
