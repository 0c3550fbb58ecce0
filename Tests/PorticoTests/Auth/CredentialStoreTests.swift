import Foundation
import HTTPTypes
import Testing
@testable import Portico
import PorticoTesting

private func oauth(_ endpoint: TestTokenEndpoint, scope: String? = nil) -> CredentialConfig {
    var config = endpoint.oauth2Config()
    config.scope = scope
    return CredentialConfig(kind: .oauth2ClientCredentials(config))
}

private func manager(_ store: CredentialStore, _ name: String) throws -> TokenManager {
    try #require(store.provider(named: name) as? OAuth2CredentialProvider).manager
}

@Suite("CredentialStore and runtime wiring", .timeLimit(.minutes(2)))
struct CredentialStoreTests {
    @Test("a reload keeps the token of an unchanged credential; a changed one gets a new manager")
    func reloadKeepsTokens() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let first = try CredentialStore(credentials: ["idp": oauth(endpoint), "key": CredentialConfig(kind: .staticHeader(header: "X-Key", value: "a"))],
                                            logger: quietLogger, clock: clock)
            let context = makeContext(clock: clock)
            #expect(try await first.provider(named: "idp")?.header(context: context).value == "Bearer tok-1")

            let second = try CredentialStore(credentials: ["idp": oauth(endpoint), "key": CredentialConfig(kind: .staticHeader(header: "X-Key", value: "b"))],
                                             previous: first, logger: quietLogger, clock: clock)
            #expect(try manager(second, "idp") === manager(first, "idp"))
            #expect(try await second.provider(named: "key")?.header(context: context).value == "b")

            // The old store lets go: the shared manager keeps working for the new one.
            await first.shutdown()
            #expect(try await second.provider(named: "idp")?.header(context: context).value == "Bearer tok-1")
            #expect(endpoint.callCount == 1)

            let third = try CredentialStore(credentials: ["idp": oauth(endpoint, scope: "other")], previous: second,
                                            logger: quietLogger, clock: clock)
            #expect(try manager(third, "idp") !== manager(second, "idp"))
            #expect(try await third.provider(named: "idp")?.header(context: context).value == "Bearer tok-2")

            // Nobody reused the second store's manager: its shutdown stops it.
            let retired = try manager(second, "idp")
            await second.shutdown()
            let error = await gatewayError { _ = try await retired.token() }
            #expect(error?.code == "credentials_unavailable")
            await third.shutdown()
        }
    }

    @Test("shutdown cancels the background refresh of providers not reused")
    func shutdownCancelsRefresh() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let store = try CredentialStore(credentials: ["idp": oauth(endpoint)], logger: quietLogger, clock: clock)
            _ = try await store.provider(named: "idp")?.header(context: makeContext(clock: clock))
            await clock.waitForSleepers(1)
            await store.shutdown()
            try await Eventually.wait { clock.sleeperCount == 0 }
            clock.advance(by: .seconds(7_200))
            #expect(endpoint.callCount == 1)
        }
    }

    @Test("an invalid static header name is a build error")
    func invalidHeader() {
        #expect(throws: CredentialStore.BuildError.self) {
            try CredentialStore(credentials: ["bad": CredentialConfig(kind: .staticHeader(header: "Bad Header", value: "x"))],
                                logger: quietLogger)
        }
    }

    @Test("GatewayRuntime builds auth middleware, injects through the chain, and reuses credentials on reload")
    func runtimeWiring() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            var config = PorticoConfig()
            config.credentials = ["idp": oauth(endpoint)]
            config.middleware = ["auth": .auth(AuthConfig(credential: "idp"))]
            config.routes = [RouteConfig(name: "ping", match: .init(path: "/ping"), direct: .init(status: 200, body: "pong"),
                                         middleware: ["auth"])]
            let runtime = try GatewayRuntime(config: config, logger: quietLogger, clock: clock)
            guard case .route(let route) = runtime.router.match(method: .get, host: nil, path: "/ping") else {
                Issue.record("no route")
                return
            }
            let context = makeContext(clock: clock)
            let response = try await route.responder.respond(
                to: GatewayRequest(head: HTTPRequest(method: .get, scheme: nil, authority: "x", path: "/ping")), context: context)
            #expect(response.status == .ok)
            #expect(context.stats.snapshot.credential == "idp")
            #expect(endpoint.callCount == 1)

            let reloaded = try GatewayRuntime(config: config, logger: quietLogger, clock: clock, previous: runtime)
            #expect(try manager(reloaded.credentials, "idp") === manager(runtime.credentials, "idp"))
            await runtime.shutdown()
            #expect(try await manager(reloaded.credentials, "idp").token().value == "tok-1")

            var unknown = config
            unknown.middleware = ["auth": .auth(AuthConfig(credential: "nope"))]
            #expect(throws: GatewayRuntime.BuildError.self) {
                try GatewayRuntime(config: unknown, logger: quietLogger, clock: clock, previous: reloaded)
            }
            // The failed build handed its share back: the reloaded runtime still owns its manager.
            #expect(try await manager(reloaded.credentials, "idp").token().value == "tok-1")
            await reloaded.shutdown()
            #expect(endpoint.callCount == 1)
        }
    }
}
