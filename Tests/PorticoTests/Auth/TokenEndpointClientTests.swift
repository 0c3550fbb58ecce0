import Foundation
import Testing
@testable import Portico
import PorticoTesting

@Suite("TokenEndpointClient", .timeLimit(.minutes(2)))
struct TokenEndpointClientTests {
    /// Characters that need form-encoding inside the Basic credentials (RFC 6749 §2.3.1).
    static let awkwardSecret = "s3cr:t/+&= é%"

    @Test("client_secret_basic and client_secret_post both authenticate, on both transports", arguments: [
        OAuth2Config.ClientAuthMethod.clientSecretBasic, .clientSecretPost,
    ], UpstreamConfig.Transport.allCases)
    func clientAuthentication(method: OAuth2Config.ClientAuthMethod, transport: UpstreamConfig.Transport) async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.clientID = "portico client"
        configuration.clientSecret = Self.awkwardSecret
        configuration.allowedClientAuth = [method == .clientSecretBasic ? .basic : .post]
        try await withEndpoint(configuration) { (endpoint) async throws in
            var config = endpoint.oauth2Config(clientAuth: method)
            config.transport = transport
            let client = TokenEndpointClient(config: config)
            let response = try await client.clientCredentials()
            #expect(response.accessToken == "tok-1")
            #expect(response.tokenType == "Bearer")
            #expect(response.expiresIn == .seconds(3_600))
            let received = try #require(endpoint.requests.first)
            #expect(received.clientAuth == (method == .clientSecretBasic ? .basic : .post))
            #expect(received.clientID == "portico client")
            #expect(received.clientSecret == Self.awkwardSecret)
            #expect(received.grantType == "client_credentials")
            if method == .clientSecretBasic {
                #expect(received.form["client_secret"] == nil)
            }
            client.shutdown()
        }
    }

    @Test("scope, audience and extra parameters reach the endpoint")
    func parameters() async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.requiredScope = "orders.read orders.write"
        configuration.requiredAudience = "https://api.example.com/"
        try await withEndpoint(configuration) { (endpoint) async throws in
            var config = endpoint.oauth2Config()
            config.scope = "orders.read orders.write"
            config.audience = "https://api.example.com/"
            config.extraParams = ["resource": "urn:orders", "tenant": "a&b c"]
            let client = TokenEndpointClient(config: config)
            #expect(try await client.clientCredentials().accessToken == "tok-1")
            let form = try #require(endpoint.requests.first).form
            #expect(form["scope"] == "orders.read orders.write")
            #expect(form["audience"] == "https://api.example.com/")
            #expect(form["resource"] == "urn:orders")
            #expect(form["tenant"] == "a&b c")

            // A scope the endpoint refuses comes back as invalid_scope with its status.
            config.scope = "admin"
            let refused = TokenEndpointClient(config: config)
            do throws(TokenEndpointError) {
                _ = try await refused.clientCredentials()
                Issue.record("expected invalid_scope")
            } catch {
                #expect(error.kind == .http(status: 400, oauthError: "invalid_scope"))
            }
            client.shutdown()
            refused.shutdown()
        }
    }

    @Test("a call after shutdown fails cleanly on both transports (URLSession would trap on an invalidated session)",
          arguments: UpstreamConfig.Transport.allCases)
    func callAfterShutdown(transport: UpstreamConfig.Transport) async throws {
        try await withEndpoint(TestTokenEndpoint.Configuration()) { (endpoint) async throws in
            var config = endpoint.oauth2Config()
            config.transport = transport
            let client = TokenEndpointClient(config: config)
            #expect(try await client.clientCredentials().accessToken == "tok-1")
            client.shutdown()
            do throws(TokenEndpointError) {
                _ = try await client.clientCredentials()
                Issue.record("expected a failure after shutdown")
            } catch {
                guard case .transport = error.kind else {
                    Issue.record("expected a transport error, got \(error)")
                    return
                }
            }
            #expect(endpoint.callCount == 1)
        }
    }

    @Test("a token endpoint that never answers times out; one answering past the size limit is refused",
          arguments: UpstreamConfig.Transport.allCases)
    func silentAndOversized(transport: UpstreamConfig.Transport) async throws {
        let upstream = TestUpstream()
        upstream.route("/silent", .never)
        upstream.route("/huge", .text(String(repeating: "x", count: TokenEndpointClient.maxResponseBytes + 1)))
        try await upstream.start()
        // URLSession's own timeout is only a backstop (the token manager enforces the
        // credential's on its clock), and it reports in words.
        let silent: TokenEndpointError.Kind = transport == .nio ? .timeout : .transport("timed out")
        let tooLarge = TokenEndpointError.Kind.malformed("response larger than \(TokenEndpointClient.maxResponseBytes) bytes")
        // A short timeout for the endpoint that never answers; a generous one for the large
        // answer, which a loaded machine may take a while to deliver.
        for (path, expected, timeout) in [("/silent", silent, Duration.milliseconds(500)), ("/huge", tooLarge, .seconds(60))] {
            var config = OAuth2Config(tokenURL: upstream.baseURL.appending(path: path), clientID: "c", clientSecret: "s")
            config.transport = transport
            let client = TokenEndpointClient(config: config, timeout: timeout)
            let started = ContinuousClock.now
            do throws(TokenEndpointError) {
                _ = try await client.clientCredentials()
                Issue.record("expected \(expected) from \(path)")
            } catch {
                #expect(error.kind == expected, "\(path)")
            }
            // The silent endpoint holds the call until it is given up: well under a minute
            // is the timeout at work (URLSession counts whole seconds; a loaded machine adds more).
            if path == "/silent" { #expect(ContinuousClock.now - started < .seconds(30)) }
            client.shutdown()
        }
        await upstream.shutdown()
    }

    @Test("an unreachable token endpoint is a transport error in words on both transports",
          arguments: UpstreamConfig.Transport.allCases)
    func refusedInWords(transport: UpstreamConfig.Transport) async throws {
        let closed = try RefusingPort()
        var config = OAuth2Config(tokenURL: URL(string: "http://127.0.0.1:\(closed.port)/token")!, clientID: "c", clientSecret: "s")
        config.transport = transport
        let client = TokenEndpointClient(config: config)
        do throws(TokenEndpointError) {
            _ = try await client.clientCredentials()
            Issue.record("expected a failure")
        } catch {
            #expect(error.kind == .transport("connection refused"))
            #expect(error.description == "token endpoint unreachable: connection refused")
        }
        client.shutdown()
        withExtendedLifetime(closed) {}
    }

    @Test("a wrong client secret is a 401 invalid_client error (the Basic challenge does not hang)")
    func badClient() async throws {
        try await withEndpoint { (endpoint) async throws in
            var config = endpoint.oauth2Config()
            config.clientSecret = "wrong-secret-value"
            let client = TokenEndpointClient(config: config, timeout: .seconds(10))
            do throws(TokenEndpointError) {
                _ = try await client.clientCredentials()
                Issue.record("expected invalid_client")
            } catch {
                #expect(error.kind == .http(status: 401, oauthError: "invalid_client"))
                #expect(!error.description.contains("wrong-secret-value"))
            }
            client.shutdown()
        }
    }

    @Test("the refresh grant uses the rotated refresh token on the next refresh")
    func refreshRotation() async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.refreshTokens = ["rt-initial"]
        try await withEndpoint(configuration) { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, grant: .refreshToken, refreshToken: "rt-initial")
            #expect(try await manager.token().value == "tok-1")
            await manager.invalidate(token: "tok-1")
            #expect(try await manager.token().value == "tok-2")
            await manager.invalidate(token: "tok-2")
            #expect(try await manager.token().value == "tok-3")
            let presented = endpoint.requests.map { $0.form["refresh_token"] }
            #expect(presented == ["rt-initial", "rt-rotated-1", "rt-rotated-2"])
            #expect(endpoint.requests.allSatisfy { $0.grantType == "refresh_token" })
            #expect(!endpoint.isRefreshTokenValid("rt-initial"))
            await manager.shutdown()
        }
    }

    @Test("without rotation the same refresh token keeps being used")
    func refreshWithoutRotation() async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.refreshTokens = ["rt-fixed"]
        configuration.rotateRefreshTokens = false
        try await withEndpoint(configuration) { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, grant: .refreshToken, refreshToken: "rt-fixed")
            #expect(try await manager.token().value == "tok-1")
            await manager.invalidate(token: "tok-1")
            #expect(try await manager.token().value == "tok-2")
            #expect(endpoint.requests.map { $0.form["refresh_token"] } == ["rt-fixed", "rt-fixed"])
            await manager.shutdown()
        }
    }

    @Test("token responses are parsed strictly", arguments: [
        ("{\"access_token\":\"abc\",\"token_type\":\"bearer\",\"expires_in\":60}", true),
        ("{\"access_token\":\"abc\",\"expires_in\":\"60\"}", true),
        ("{\"access_token\":\"abc\",\"expires_in\":null}", true),
        ("{\"access_token\":\"abc\",\"expires_in\":\"\"}", false),
        ("{\"access_token\":null}", false),
        ("{\"access_token\":\"a\\r\\nX-Evil: 1\"}", false),
        ("not json", false),
    ])
    func parsing(body: String, valid: Bool) {
        let result = Result { () throws(TokenEndpointError) -> TokenResponse in try TokenEndpointClient.parse(Data(body.utf8)) }
        #expect(((try? result.get()) != nil) == valid)
        if valid, let response = try? result.get() {
            #expect(response.accessToken == "abc")
            #expect(response.tokenType == "Bearer")
        }
    }
}

@Suite("Secrets stay out of errors", .timeLimit(.minutes(2)))
struct SecretRedactionTests {
    static let secret = "SuperSecretValue-1234"

    @Test("no secret, token or refresh token appears in any error or value description")
    func descriptions() async throws {
        var configuration = TestTokenEndpoint.Configuration()
        configuration.clientSecret = Self.secret
        configuration.refreshTokens = ["rt-SecretRefresh"]
        try await withEndpoint(configuration) { (endpoint) async throws in
            var descriptions: [String] = []
            func collect(_ value: Any) {
                descriptions.append(String(describing: value))
                descriptions.append(String(reflecting: value))
            }

            // Wrong secret (401), echoed secret as error code, garbage containing the secret.
            for failure: TestTokenEndpoint.Failure? in [nil, .status(400, error: Self.secret),
                                                         .body("{\"access_token\":5,\"echo\":\"\(Self.secret)\"}"),
                                                         .status(500), .closed] {
                try await endpoint.setFailure(failure)
                var config = endpoint.oauth2Config()
                if failure == nil { config.clientSecret = Self.secret + "-wrong" }
                let client = TokenEndpointClient(config: config)
                do {
                    _ = try await client.clientCredentials()
                    Issue.record("expected a failure for \(String(describing: failure))")
                } catch {
                    collect(error)
                }
                client.shutdown()
            }
            try await endpoint.setFailure(nil)

            // The 503 a client would see, after a token was issued and rejected.
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock, grant: .refreshToken, refreshToken: "rt-SecretRefresh")
            let token = try await manager.token()
            collect(token)
            let response = TokenResponse(accessToken: token.value, expiresIn: .seconds(1), refreshToken: "rt-SecretRefresh")
            collect(response)
            let provider = OAuth2CredentialProvider(manager: manager)
            let header = try await provider.header(context: makeContext(clock: clock))
            collect(header)
            try await endpoint.setFailure(.status(500))
            await manager.invalidate(token: token.value)
            do {
                _ = try await manager.token()
                Issue.record("expected 503")
            } catch {
                collect(error)
                if let error = error as? GatewayError {
                    collect(String(decoding: error.response(requestID: "r").body.bytes, as: UTF8.self))
                }
            }
            collect(BasicAuthProvider(name: "b", username: "user", password: Self.secret))
            await manager.shutdown()

            #expect(descriptions.count > 10)
            for description in descriptions {
                #expect(!description.contains(Self.secret), "\(description)")
                #expect(!description.contains("tok-"), "\(description)")
                #expect(!description.contains("rt-"), "\(description)")
            }
        }
    }
}
