import Foundation
import HTTPTypes
import Logging
import Testing
@testable import Portico
import PorticoTesting

let quietLogger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

func makeContext(clock: any GatewayClock) -> RequestContext {
    RequestContext(requestID: "test-request", deadline: clock.now.advanced(by: .seconds(86_400)),
                   logger: quietLogger, clock: clock)
}

/// Deterministic backoff for tests: the full ceiling every time (jitter fraction 1).
func testOptions(proactive: Bool = true, base: Duration = .seconds(1), cap: Duration = .seconds(30),
                 jitter: Double = 1) -> TokenManager.Options {
    var options = TokenManager.Options()
    options.proactiveRefresh = proactive
    options.backoffBase = base
    options.backoffCap = cap
    options.jitter = { jitter }
    return options
}

func makeManager(_ endpoint: TestTokenEndpoint, clock: any GatewayClock,
                 clientAuth: OAuth2Config.ClientAuthMethod = .clientSecretBasic,
                 configure: (inout OAuth2Config) -> Void = { _ in },
                 grant: TokenEndpointClient.Grant = .clientCredentials, refreshToken: String? = nil,
                 refreshBeforeExpiry: Duration = .seconds(30), defaultLifetime: Duration = .seconds(300),
                 timeout: Duration = .seconds(5), options: TokenManager.Options = testOptions()) -> TokenManager {
    var config = endpoint.oauth2Config(clientAuth: clientAuth)
    configure(&config)
    // The manager enforces `timeout` on the test's clock; the client's real-time backstop only has
    // to outlast a slow call on a loaded machine (a hung call is cancelled, not waited out).
    let client = TokenEndpointClient(config: config, grant: grant, timeout: max(timeout, .seconds(60)))
    return TokenManager(name: "idp", source: client, clock: clock, refreshBeforeExpiry: refreshBeforeExpiry,
                        defaultLifetime: defaultLifetime, timeout: timeout, refreshToken: refreshToken,
                        options: options, logger: quietLogger)
}

/// Runs `body` with a fresh endpoint and always stops it.
func withEndpoint(_ configuration: TestTokenEndpoint.Configuration = .init(),
                  _ body: (TestTokenEndpoint) async throws -> Void) async throws {
    let endpoint = try TestTokenEndpoint(configuration)
    do {
        try await body(endpoint)
        await endpoint.stop()
    } catch {
        await endpoint.stop()
        throw error
    }
}

/// `count` concurrent `token()` calls; each outcome is the token value or the error.
func concurrentTokens(_ manager: TokenManager, count: Int) async -> [Result<String, any Error>] {
    await withTaskGroup(of: Result<String, any Error>.self) { group in
        for _ in 0..<count {
            group.addTask {
                do { return .success(try await manager.token().value) } catch { return .failure(error) }
            }
        }
        var results: [Result<String, any Error>] = []
        for await result in group { results.append(result) }
        return results
    }
}

/// The `GatewayError` thrown by `operation`, recording an issue when there is none.
func gatewayError(_ operation: () async throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) async -> GatewayError? {
    do {
        try await operation()
        Issue.record("expected a GatewayError, got success", sourceLocation: sourceLocation)
        return nil
    } catch let error as GatewayError {
        return error
    } catch {
        Issue.record("expected a GatewayError, got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

func isCredentialsUnavailable(_ result: Result<String, any Error>) -> Bool {
    guard case .failure(let error) = result, let gatewayError = error as? GatewayError else { return false }
    return gatewayError.code == "credentials_unavailable" && gatewayError.status == .serviceUnavailable
}
