import Foundation
import Logging
import Portico
import PorticoTesting
import RedisClient
import Synchronization
import Testing

/// `store:` on an OAuth2 credential (issue #43): replicas — each its own stores and credential
/// store, as separate processes have — share one token through a real `redis-server`, so the
/// token endpoint sees one call per token however many replicas ask.
@Suite("Tokens shared by every replica on Redis", .serialized, .enabled(if: RedisServer.available, "redis-server is not installed"))
struct SharedTokenTests {
    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
    /// 32 bytes each, base64.
    static let keyA = Data((0..<32).map { UInt8($0) }).base64EncodedString()
    static let keyB = Data((0..<32).map { UInt8(200 - $0) }).base64EncodedString()

    static func yaml(redis: String, endpoint: TestTokenEndpoint, keys: [String] = [keyA], timeout: String = "20s",
                     refreshBeforeExpiry: String = "30s") -> String {
        """
        stores:
          fleet: { type: redis, url: "\(redis)", timeout: 2s, connect_timeout: 2s }
        credentials:
          idp:
            type: oauth2_client_credentials
            token_url: "\(endpoint.url.absoluteString)"
            client_id: portico
            client_secret: test-client-secret
            timeout: \(timeout)
            refresh_before_expiry: \(refreshBeforeExpiry)
            store: fleet
            encryption_key: [\(keys.map { "\"\($0)\"" }.joined(separator: ", "))]
        upstreams:
          api: { url: "http://127.0.0.1:9" }
        routes:
          - { name: api, match: { path_prefix: / }, upstream: api }
        """
    }

    final class Tokens: Sendable {
        private let list = Mutex<[String]>([])
        func append(_ token: String) { list.withLock { $0.append(token) } }
        var values: [String] { list.withLock { $0 } }
    }

    /// One replica's stores and credentials, as a process would build them.
    final class Replica: Sendable {
        let stores: RateLimitStores
        let credentials: CredentialStore

        init(_ yaml: String, clock: any GatewayClock = SystemClock()) throws {
            let config = try ConfigLoader.load(yaml: yaml, environment: [:])
            stores = try RateLimitStores(stores: config.stores, logger: SharedTokenTests.logger)
            credentials = try CredentialStore(config: config, stores: stores, logger: SharedTokenTests.logger, clock: clock)
        }

        var manager: TokenManager {
            get throws { try #require(credentials.provider(named: "idp") as? OAuth2CredentialProvider).manager }
        }

        func token() async throws -> String { try await manager.token().value }

        func stop() async {
            await credentials.shutdown()
            await stores.shutdown()
        }
    }

    @Test("five replicas asking at once on an empty store: the token endpoint is called once, and all five hold its token")
    func oneFetchForTheFleet() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let endpoint = try TestTokenEndpoint()
        let replicas = try (0..<5).map { _ in try Replica(Self.yaml(redis: redis.url, endpoint: endpoint)) }
        // The first call hangs until every replica has asked: the others find the lease taken.
        try await endpoint.setFailure(.hang)
        let tokens = Tokens()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for replica in replicas {
                group.addTask { tokens.append(try await replica.token()) }
            }
            try await endpoint.waitForHung(1)
            try await endpoint.setFailure(nil)
            try await group.waitForAll()
        }
        #expect(endpoint.callCount == 1, "one token call for five replicas")
        #expect(tokens.values == Array(repeating: "tok-1", count: 5))
        // `/credentials` and the dashboard say where each replica's token came from.
        let fleets = try replicas.map { try CredentialReport.fleet(of: $0.manager) }
        #expect(fleets.allSatisfy { $0?.store == "fleet" })
        #expect(fleets.filter { $0?.lastToken == "fetched" }.count == 1, "\(fleets)")
        // The others read it: after waiting on its lease, or (asking late) at once.
        #expect(fleets.filter { ["lease_wait", "shared"].contains($0?.lastToken) }.count == 4, "\(fleets)")
        // What the store holds is sealed: the token itself is not in it.
        let pool = try RedisConnectionPool(configuration: RedisConfiguration(url: redis.url))
        let keys = try await pool.send(["KEYS", "portico:token:idp:*"]).array?.compactMap(\.string) ?? []
        let record = try #require(keys.first { !$0.hasSuffix(":lease") })
        let stored = try #require(try await pool.send(["GET", .string(record)]).string)
        #expect(stored.hasPrefix("v1.") && !stored.contains("tok-1"), "the record is AES-GCM sealed: \(stored.prefix(12))…")
        #expect(!keys.contains { $0.hasSuffix(":lease") }, "the lease was freed once the token was written")
        await pool.shutdown()
        // A replica that starts later reads it: still one call.
        let late = try Replica(Self.yaml(redis: redis.url, endpoint: endpoint))
        #expect(try await late.token() == "tok-1")
        #expect(endpoint.callCount == 1)
        for replica in replicas + [late] { await replica.stop() }
        await endpoint.stop()
    }

    @Test("a token an upstream rejected is not handed back: the replica that saw the rejection fetches, the others then read the new one")
    func rejectedTokenIsReplaced() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let endpoint = try TestTokenEndpoint()
        let one = try Replica(Self.yaml(redis: redis.url, endpoint: endpoint))
        let two = try Replica(Self.yaml(redis: redis.url, endpoint: endpoint))
        #expect(try await one.token() == "tok-1")
        #expect(try await two.token() == "tok-1")
        try await one.manager.invalidate(token: "tok-1")
        #expect(try await one.token() == "tok-2", "the store's tok-1 was the rejected one")
        try await two.manager.invalidate(token: "tok-1")
        #expect(try await two.token() == "tok-2")
        #expect(endpoint.callCount == 2)
        await one.stop()
        await two.stop()
        await endpoint.stop()
    }

    @Test("the refresh ahead of expiry happens once for the fleet: one replica refreshes, the other takes its token")
    func proactiveRefreshOnce() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let endpoint = try TestTokenEndpoint()
        endpoint.update { $0.expiresIn = 120 }
        let clock = ManualClock()
        let yaml = Self.yaml(redis: redis.url, endpoint: endpoint, refreshBeforeExpiry: "30s")
        let one = try Replica(yaml, clock: clock), two = try Replica(yaml, clock: clock)
        #expect(try await one.token() == "tok-1")
        #expect(try await two.token() == "tok-1")
        #expect(endpoint.callCount == 1)
        // Past the refresh point (90 s in): both background refreshes run; the second to ask
        // finds the lease taken and polls on the clock, which the test moves along.
        clock.advance(by: .seconds(91))
        let managers = [try one.manager, try two.manager]
        try await Eventually.wait(timeout: .seconds(60), "both replicas hold the refreshed token") {
            clock.advance(by: .milliseconds(25))
            for manager in managers {
                let status = await manager.status
                let value = try? await manager.token().value
                guard !status.refreshing, status.lastRefresh != nil, value == "tok-2" else { return false }
            }
            return true
        }
        #expect(endpoint.callCount == 2, "one call at the start, one refresh for both replicas")
        await one.stop()
        await two.stop()
        await endpoint.stop()
    }

    @Test("key rotation: a token sealed with the old key opens where the new key comes first; a replica without the old key fetches its own")
    func keyRotation() async throws {
        let redis = try await RedisServer.start()
        defer { redis.stop() }
        let endpoint = try TestTokenEndpoint()
        let old = try Replica(Self.yaml(redis: redis.url, endpoint: endpoint, keys: [Self.keyA]))
        #expect(try await old.token() == "tok-1")
        let rotating = try Replica(Self.yaml(redis: redis.url, endpoint: endpoint, keys: [Self.keyB, Self.keyA]))
        #expect(try await rotating.token() == "tok-1", "the old key still opens")
        #expect(endpoint.callCount == 1)
        let stranger = try Replica(Self.yaml(redis: redis.url, endpoint: endpoint, keys: [Self.keyB]))
        #expect(try await stranger.token() == "tok-2", "a record it cannot open is ignored, never a failure")
        #expect(endpoint.callCount == 2)
        // It sealed tok-2 with key B: the first replica cannot open that, the rotating one can.
        try await old.manager.invalidate(token: "tok-1")
        #expect(try await old.token() == "tok-3")
        try await rotating.manager.invalidate(token: "tok-1")
        #expect(try await rotating.token() == "tok-3")
        for replica in [old, rotating, stranger] { await replica.stop() }
        await endpoint.stop()
    }

    @Test("the store unreachable: every replica fetches its own token and is served")
    func storeDownFallsBack() async throws {
        let refusing = try RefusingPort()
        let endpoint = try TestTokenEndpoint()
        let yaml = Self.yaml(redis: "redis://127.0.0.1:\(refusing.port)/0", endpoint: endpoint)
        let one = try Replica(yaml), two = try Replica(yaml)
        #expect(try await one.token() == "tok-1")
        #expect(try await two.token() == "tok-2")
        #expect(endpoint.callCount == 2)
        await one.stop()
        await two.stop()
        await endpoint.stop()
    }

    @Test("check: store needs encryption_key, a key must be 32 bytes of base64, encryption_key needs store; messages never show a key")
    func configErrors() throws {
        let endpoint = "http://127.0.0.1:9/token"
        func errors(_ credential: String) -> String {
            let yaml = """
                stores:
                  fleet: { type: redis, url: "redis://127.0.0.1:6379" }
                credentials:
                  idp:
                    type: oauth2_client_credentials
                    token_url: "\(endpoint)"
                    client_id: portico
                    client_secret: s
                \(credential)
                upstreams:
                  api: { url: "http://127.0.0.1:9" }
                routes:
                  - { name: api, match: { path_prefix: / }, upstream: api }
                """
            do {
                _ = try ConfigLoader.load(yaml: yaml, environment: [:])
                return ""
            } catch {
                return "\(error)"
            }
        }
        #expect(errors("    store: fleet").contains("credentials.idp.store: needs encryption_key"))
        let short = Data(repeating: 7, count: 16).base64EncodedString()
        let message = errors("    store: fleet\n    encryption_key: \"\(short)\"")
        #expect(message.contains("credentials.idp.encryption_key") && message.contains("16 bytes"))
        #expect(!message.contains(short), "the key is never shown")
        #expect(errors("    store: fleet\n    encryption_key: \"not base64!\"").contains("is not base64"))
        #expect(errors("    encryption_key: \"\(Self.keyA)\"").contains("applies only with store"))
        #expect(errors("    store: elsewhere\n    encryption_key: \"\(Self.keyA)\"").contains("credentials.idp.store"))
        #expect(errors("    store: fleet\n    encryption_key: [\"\(Self.keyA)\", \"\(Self.keyB)\"]") == "")
    }
}
