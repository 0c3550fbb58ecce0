import Foundation
import HTTPTypes
import Synchronization
import Testing
@testable import Portico
import PorticoTesting

/// A fake upstream behind the middleware: records what it saw, answers 200 for a current token.
private final class FakeUpstream: Sendable {
    private let seen = Synchronization.Mutex<[[String]]>([])
    private let decide: @Sendable ([String]) -> HTTPResponse.Status

    init(_ decide: @escaping @Sendable ([String]) -> HTTPResponse.Status) {
        self.decide = decide
    }

    /// The `Authorization` values of each call.
    var calls: [[String]] { seen.withLock { $0 } }

    var next: NextHandler {
        { request, _ in
            let values = request.headerFields[values: .authorization]
            self.seen.withLock { $0.append(values) }
            return GatewayResponse(status: self.decide(values))
        }
    }

    static func demanding(_ endpoint: TestTokenEndpoint) -> FakeUpstream {
        FakeUpstream { values in
            values.count == 1 && endpoint.authorizes(values[0]) ? .ok : .unauthorized
        }
    }
}

private func request(authorization: String? = nil, body: Body = .empty) -> GatewayRequest {
    var fields = HTTPFields()
    if let authorization { fields[.authorization] = authorization }
    return GatewayRequest(head: HTTPRequest(method: .post, scheme: nil, authority: "api.test", path: "/orders",
                                            headerFields: fields), body: body)
}

@Suite("AuthMiddleware", .timeLimit(.minutes(2)))
struct AuthMiddlewareTests {
    @Test("a 401 leads to one refresh and one replay with the new token")
    func replayOnce() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            let middleware = AuthMiddleware(provider: OAuth2CredentialProvider(manager: manager))
            #expect(try await manager.token().value == "tok-1")
            endpoint.revoke("tok-1")
            let upstream = FakeUpstream.demanding(endpoint)
            let context = makeContext(clock: clock)
            let response = try await middleware.handle(request(body: "payload"), context: context, next: upstream.next)
            #expect(response.status == .ok)
            #expect(upstream.calls == [["Bearer tok-1"], ["Bearer tok-2"]])
            #expect(endpoint.callCount == 2)
            #expect(context.stats.snapshot.credential == "idp")
            await manager.shutdown()
        }
    }

    @Test("a second 401 goes back to the client: no loop")
    func secondUnauthorized() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            let middleware = AuthMiddleware(provider: OAuth2CredentialProvider(manager: manager))
            let upstream = FakeUpstream { _ in .unauthorized }
            let response = try await middleware.handle(request(), context: makeContext(clock: clock), next: upstream.next)
            #expect(response.status == .unauthorized)
            #expect(upstream.calls == [["Bearer tok-1"], ["Bearer tok-2"]])
            #expect(endpoint.callCount == 2)
            await manager.shutdown()
        }
    }

    @Test("concurrent 401s for the same stale token cause one refresh")
    func concurrentUnauthorized() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            let middleware = AuthMiddleware(provider: OAuth2CredentialProvider(manager: manager))
            _ = try await manager.token()
            endpoint.revoke("tok-1")
            let upstream = FakeUpstream.demanding(endpoint)
            let statuses = await withTaskGroup(of: HTTPResponse.Status?.self) { group in
                for _ in 0..<300 {
                    group.addTask {
                        try? await middleware.handle(request(), context: makeContext(clock: clock), next: upstream.next).status
                    }
                }
                var statuses: [HTTPResponse.Status?] = []
                for await status in group { statuses.append(status) }
                return statuses
            }
            #expect(statuses.count == 300)
            #expect(statuses.allSatisfy { $0 == .ok })
            #expect(endpoint.callCount == 2)
            #expect(endpoint.issuedTokens == ["tok-1", "tok-2"])
            await manager.shutdown()
        }
    }

    @Test("override replaces the client's Authorization; keep_if_present keeps it and fetches nothing")
    func clientHeaderPolicy() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            let provider = OAuth2CredentialProvider(manager: manager)
            let upstream = FakeUpstream { _ in .ok }

            let keep = AuthMiddleware(provider: provider, clientHeader: .keepIfPresent)
            let keptContext = makeContext(clock: clock)
            _ = try await keep.handle(request(authorization: "Bearer client-own"), context: keptContext, next: upstream.next)
            #expect(upstream.calls.last == ["Bearer client-own"])
            #expect(endpoint.callCount == 0)
            #expect(keptContext.stats.snapshot.credential == nil)
            // Without a client header, keep_if_present injects.
            _ = try await keep.handle(request(), context: makeContext(clock: clock), next: upstream.next)
            #expect(upstream.calls.last == ["Bearer tok-1"])

            var twice = request(authorization: "Bearer client-own")
            twice.headerFields.append(HTTPField(name: .authorization, value: "Basic Y2xpZW50OnNlY3JldA=="))
            let override = AuthMiddleware(provider: provider, clientHeader: .override)
            _ = try await override.handle(twice, context: makeContext(clock: clock), next: upstream.next)
            #expect(upstream.calls.last == ["Bearer tok-1"])
            await manager.shutdown()
        }
    }

    @Test("static and basic credentials are injected; their 401s are not replayed")
    func fixedCredentials() async throws {
        let clock = ManualClock()
        let upstream = FakeUpstream { _ in .unauthorized }
        let apiKey = try #require(StaticHeaderProvider(name: "key", header: "X-Api-Key", value: "k-123"))
        let capture = Synchronization.Mutex<HTTPFields?>(nil)
        let next: NextHandler = { request, _ in
            capture.withLock { $0 = request.headerFields }
            return GatewayResponse(status: .unauthorized)
        }
        let response = try await AuthMiddleware(provider: apiKey).handle(request(), context: makeContext(clock: clock), next: next)
        #expect(response.status == .unauthorized)
        let captured = capture.withLock { $0 }
        #expect(captured?[HTTPField.Name("X-Api-Key")!] == "k-123")

        let basic = BasicAuthProvider(name: "basic", username: "user", password: "pa:ss")
        let context = makeContext(clock: clock)
        let basicResponse = try await AuthMiddleware(provider: basic).handle(request(authorization: "Bearer x"),
                                                                             context: context, next: upstream.next)
        #expect(basicResponse.status == .unauthorized)
        #expect(upstream.calls == [["Basic " + Data("user:pa:ss".utf8).base64EncodedString()]])
        #expect(context.stats.snapshot.credential == "basic")
    }

    @Test("with the IdP down and no token, the middleware fails with 503 credentials_unavailable and never calls next")
    func unavailable() async throws {
        try await withEndpoint { (endpoint) async throws in
            let clock = ManualClock()
            let manager = makeManager(endpoint, clock: clock)
            try await endpoint.setFailure(.status(500))
            let upstream = FakeUpstream { _ in .ok }
            let middleware = AuthMiddleware(provider: OAuth2CredentialProvider(manager: manager))
            let error = await gatewayError {
                _ = try await middleware.handle(request(), context: makeContext(clock: clock), next: upstream.next)
            }
            #expect(error?.status == .serviceUnavailable)
            #expect(error?.code == "credentials_unavailable")
            #expect(upstream.calls.isEmpty)
            await manager.shutdown()
        }
    }

    @Test("a streamed request body is not replayed: the 401 goes back to the client")
    func nonReplayableBody() async throws {
        let provider = RotatingProvider()
        let calls = Synchronization.Mutex(0)
        let next: NextHandler = { _, _ in
            calls.withLock { $0 += 1 }
            return GatewayResponse(status: .unauthorized)
        }
        let (body, _) = MiddlewareStreamFixture.body()
        let response = try await AuthMiddleware(provider: provider)
            .handle(request(body: body), context: makeContext(clock: ManualClock()), next: next)
        #expect(response.status == .unauthorized)
        #expect(calls.withLock { $0 } == 1)
        #expect(provider.invalidations == 0)
    }

    @Test("a replayed 401's streamed body is cancelled, releasing its connection")
    func replayedUnauthorizedBodyCancelled() async throws {
        let provider = RotatingProvider()
        let (rejected, writer) = MiddlewareStreamFixture.response(401)
        let next: NextHandler = { request, _ in
            request.headerFields[.authorization] == "Bearer t1" ? rejected : GatewayResponse(status: .ok)
        }
        let response = try await AuthMiddleware(provider: provider)
            .handle(request(body: "payload"), context: makeContext(clock: ManualClock()), next: next)
        #expect(response.status == .ok)
        #expect(provider.invalidations == 1)
        #expect(writer.readerGone != nil)
    }
}

/// Hands out `Bearer t1`, then `Bearer t2` once `t1` is invalidated.
private final class RotatingProvider: CredentialProvider {
    private let generation = Synchronization.Mutex(1)
    private let invalidated = Synchronization.Mutex(0)
    var name: String { "rotating" }
    var headerName: HTTPField.Name { .authorization }
    var invalidations: Int { invalidated.withLock { $0 } }

    func header(context: RequestContext) async throws -> CredentialHeader {
        let token = "t\(generation.withLock { $0 })"
        return CredentialHeader(name: .authorization, value: "Bearer \(token)", token: token)
    }

    func invalidate(_ header: CredentialHeader) async -> Bool {
        invalidated.withLock { $0 += 1 }
        generation.withLock { $0 += 1 }
        return true
    }

    func shutdown() async {}
}
