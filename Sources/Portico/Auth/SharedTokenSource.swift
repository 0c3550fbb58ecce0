import Crypto
import Foundation
import Logging
import RedisClient
import Synchronization

/// `store:` on an OAuth2 credential: one token for every replica, so the identity provider sees
/// one refresh per token lifetime however many replicas run (issue #43).
///
/// Wraps the real token source. Asked for a token, it first reads the store: a token another
/// replica fetched (and that is not the one being replaced: the one this replica holds and
/// wants to refresh, or the one an upstream just rejected) is taken as is. Otherwise it takes a
/// short lease on the store (`SET NX PX`, with a random fencing value), fetches, and writes the
/// token — sealed with AES-GCM (`TokenVault`), with its expiry — only while it still holds the
/// lease; a fetch that finished after its lease ran out never overwrites a newer token. A
/// replica that finds the lease taken reads again every `pollInterval` until the token appears,
/// the lease is free to take (its holder failed), or `peerWait` has passed; then it fetches on
/// its own. When the store fails it fetches on its own too: the store saves calls, it is never
/// what stands between a request and its token.
///
/// What each call did is `portico_token_store_total{credential,outcome}`: `shared` (a token
/// another replica fetched), `lease_wait` (the same, after waiting on that replica's lease), `fetched` (fetched under the lease and shared), `fallback` (fetched
/// without the store: it failed, or the wait for a peer ran out).
final class SharedTokenSource: TokenSource {
    enum Outcome: String, CaseIterable {
        /// A token another replica had fetched, found at once.
        case shared
        /// A token another replica fetched while this one waited on its lease.
        case leaseWait = "lease_wait"
        case fetched, fallback
    }

    /// What the store holds for one credential, sealed.
    struct Record: Codable, Equatable {
        var accessToken: String
        var tokenType: String
        /// Wall-clock expiry, Unix milliseconds: every replica reads it against its own clock.
        var expiresAtMilliseconds: Int64
        var refreshToken: String?

        enum CodingKeys: String, CodingKey {
            case accessToken = "access_token", tokenType = "token_type"
            case expiresAtMilliseconds = "expires_at_ms", refreshToken = "refresh_token"
        }
    }

    static let outcomes = LabelledCounters("portico_token_store_total")

    /// Writes the record only while the writer's lease is still the one in the store, and frees
    /// the lease. KEYS[1] the record, KEYS[2] the lease; ARGV: fence, record, its lifetime in ms.
    static let writeScript = RedisScript("""
        if redis.call('GET', KEYS[2]) == ARGV[1] then
          redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
          redis.call('DEL', KEYS[2])
          return 1
        end
        return 0
        """)

    let credential: String
    private let last = Mutex<Outcome?>(nil)
    private let inner: any TokenSource
    private let backend: RedisBucketStore
    private let vault: TokenVault
    private let clock: any GatewayClock
    private let logger: Logger
    let recordKey: [UInt8]
    let leaseKey: [UInt8]
    /// How long a lease holds: the credential's `timeout`, the longest one token call may take.
    private let leaseTime: Duration
    /// How long a replica waits for a peer's token before it fetches its own: half the
    /// credential's `timeout`, so its own call still has the other half.
    private let peerWait: Duration
    private let pollInterval: Duration
    private let defaultLifetime: Duration
    /// One command's bound: the store's `timeout` is tuned for requests (25 ms by default); a
    /// token's few calls per lifetime can wait longer, never longer than this.
    private let commandTimeout: Duration

    init(credential: String, inner: any TokenSource, backend: RedisBucketStore, keys: TokenEncryptionKeys,
         identity: String, clock: any GatewayClock, timeout: Duration, defaultLifetime: Duration,
         pollInterval: Duration = .milliseconds(25), logger: Logger) {
        self.credential = credential
        self.inner = inner
        self.backend = backend
        self.vault = TokenVault(keys)
        self.clock = clock
        self.logger = logger
        // The identity hash keeps two deployments with one credential name (another client, IdP
        // or scope) apart on one Redis; it is a hash, so it names nothing secret.
        let digest = SHA256.hash(data: Array(identity.utf8)).prefix(8).map { String(format: "%02x", $0) }.joined()
        recordKey = Array("\(backend.config.keyPrefix)token:\(credential):\(digest)".utf8)
        leaseKey = recordKey + Array(":lease".utf8)
        leaseTime = timeout
        peerWait = timeout / 2
        self.pollInterval = pollInterval
        self.defaultLifetime = defaultLifetime
        commandTimeout = max(backend.config.timeout, .seconds(1))
    }

    /// What makes one credential's tokens interchangeable: who asks the IdP for what. Never the secret.
    static func identity(of config: OAuth2Config) -> String {
        let params = config.extraParams.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        return ([config.tokenURL.absoluteString, config.clientID, config.scope ?? "", config.audience ?? ""] + params)
            .joined(separator: "\n")
    }

    func fetch(refreshToken: String?) async throws(TokenEndpointError) -> TokenResponse {
        try await fetch(refreshToken: refreshToken, replacing: nil)
    }

    func fetch(refreshToken: String?, replacing: String?) async throws(TokenEndpointError) -> TokenResponse {
        var refreshToken = refreshToken
        let consulted: Consulted?
        do throws(RedisError) {
            consulted = try await consultStore(replacing: replacing, refreshToken: &refreshToken)
        } catch {
            logger.warning("shared token: the store failed; fetching a token here",
                           metadata: ["credential": "\(credential)", "kind": "\(StoreErrorKind(error).rawValue)"])
            consulted = nil
        }
        switch consulted {
        case .shared(let response, let waited)?:
            count(waited ? .leaseWait : .shared)
            return response
        case .leased(let fence)?:
            return try await fetchHolding(fence, refreshToken: refreshToken)
        case .waitedOut?:
            logger.notice("shared token: no token from the other replicas in time; fetching one here",
                          metadata: ["credential": "\(credential)", "waited_ms": "\(Int64(peerWait / .milliseconds(1)))"])
        case .cancelled?:
            throw TokenEndpointError(.timeout)
        case nil:
            break
        }
        count(.fallback)
        return try await inner.fetch(refreshToken: refreshToken)
    }

    private enum Consulted {
        /// A token another replica fetched (`waited`: while this one waited on its lease).
        case shared(TokenResponse, waited: Bool)
        /// This replica holds the lease (with this fence) and fetches.
        case leased(String)
        /// The lease stayed taken and no token came within `peerWait`.
        case waitedOut
        /// The caller gave up (its task was cancelled).
        case cancelled
    }

    /// Reads, takes the lease or waits for whoever has it, until one of them settles it.
    /// `refreshToken` becomes the freshest one the store holds (the IdP may rotate it).
    private func consultStore(replacing: String?, refreshToken: inout String?) async throws(RedisError) -> Consulted {
        let deadline = clock.now.advanced(by: peerWait)
        var waited = false
        while true {
            if let record = try await read() {
                if record.accessToken != replacing, let response = usable(record) { return .shared(response, waited: waited) }
                if let rotated = record.refreshToken { refreshToken = rotated }
            }
            let fence = RedisLease.fence()
            if try await takeLease(fence) {
                // The holder before may have written and freed the lease between the read above
                // and this: read once more while holding it.
                if let record = try await read(), record.accessToken != replacing, let response = usable(record) {
                    try await releaseLease(fence)
                    return .shared(response, waited: waited)
                }
                return .leased(fence)
            }
            guard clock.now < deadline else { return .waitedOut }
            waited = true
            do {
                try await clock.sleep(until: min(deadline, clock.now.advanced(by: pollInterval)))
            } catch {
                return .cancelled
            }
        }
    }

    func shutdown() {
        inner.shutdown()
    }

    // MARK: - The store

    /// This replica holds the lease: fetch, then share what came back (or free the lease).
    private func fetchHolding(_ fence: String, refreshToken: String?) async throws(TokenEndpointError) -> TokenResponse {
        let response: TokenResponse
        do throws(TokenEndpointError) {
            response = try await inner.fetch(refreshToken: refreshToken)
        } catch {
            // Another replica may try at once; each backs off on its own schedule.
            try? await releaseLease(fence)
            throw error
        }
        count(.fetched)
        let lifetime = response.expiresIn ?? defaultLifetime
        let record = Record(accessToken: response.accessToken, tokenType: response.tokenType,
                            expiresAtMilliseconds: Self.milliseconds(clock.wallNow) + Int64(lifetime / .milliseconds(1)),
                            refreshToken: response.refreshToken ?? refreshToken)
        do {
            let sealed = try vault.seal(Array(try JSONEncoder().encode(record)), boundTo: recordKey)
            let written = try await backend.evaluate(Self.writeScript, keys: [recordKey, leaseKey], arguments: [
                .string(fence), .string(sealed), .string(String(max(1, Int64(lifetime / .milliseconds(1))))),
            ], timeout: commandTimeout)
            if written.int != 1 {
                logger.notice("shared token: the lease ran out before the token came; kept here, not shared",
                              metadata: ["credential": "\(credential)"])
            }
        } catch {
            logger.warning("shared token: could not share the token fetched here",
                           metadata: ["credential": "\(credential)", "error": "\(String(describing: error))"])
        }
        return response
    }

    /// Frees the lease if it is still this replica's.
    private func releaseLease(_ fence: String) async throws(RedisError) {
        try await RedisLease.release(leaseKey, fence: fence, on: backend, timeout: commandTimeout)
    }

    private func takeLease(_ fence: String) async throws(RedisError) -> Bool {
        try await RedisLease.take(leaseKey, fence: fence, for: leaseTime, on: backend, timeout: commandTimeout)
    }

    /// The record in the store, opened; `nil` when there is none, or none this replica can open
    /// (logged: a key missing from `encryption_key` is a configuration error to fix).
    func read() async throws(RedisError) -> Record? {
        let reply = try await backend.send(["GET", .bytes(recordKey)], timeout: commandTimeout)
        guard case .bulkString(let bytes) = reply else { return nil }
        do {
            let plain = try vault.open(String(decoding: bytes, as: UTF8.self), boundTo: recordKey)
            return try JSONDecoder().decode(Record.self, from: Data(plain))
        } catch {
            let reason: String = switch error as? TokenVault.OpenFailure {
            case .unknownKey(let id)?: "sealed with key \(id), which encryption_key does not list"
            case .rejected?: "does not open with its key (damaged, or written by another credential)"
            default: "not a token record"
            }
            logger.warning("shared token: ignoring the stored token", metadata: ["credential": "\(credential)", "reason": "\(reason)"])
            return nil
        }
    }

    /// The record as a token response, when it has at least a second left.
    private func usable(_ record: Record) -> TokenResponse? {
        let left = record.expiresAtMilliseconds - Self.milliseconds(clock.wallNow)
        guard left >= 1_000 else { return nil }
        return TokenResponse(accessToken: record.accessToken, tokenType: record.tokenType,
                             expiresIn: .milliseconds(left), refreshToken: record.refreshToken)
    }

    private func count(_ outcome: Outcome) {
        Self.outcomes.increment([("credential", credential), ("outcome", outcome.rawValue)])
        last.withLock { $0 = outcome }
    }

    /// How the latest token was had (`/credentials`, the dashboard); `nil` before the first.
    var lastOutcome: Outcome? { last.withLock { $0 } }
    /// The `stores.NAME` tokens are shared through.
    var storeName: String { backend.name }

    private static func milliseconds(_ date: Date) -> Int64 {
        Int64((date.timeIntervalSince1970 * 1000).rounded())
    }
}
