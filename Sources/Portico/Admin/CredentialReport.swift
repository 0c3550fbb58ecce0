import Foundation
import Metrics

/// `GET /credentials`: each credential's health right now. Holds no secret: names, kinds,
/// times, counts and the token endpoint's error text (which never carries one).
public struct CredentialReport: Sendable, Encodable, Equatable {
    public struct Entry: Sendable, Encodable, Equatable {
        public var name: String
        /// `static`, `basic`, `oauth2_client_credentials`, `oauth2_refresh_token`.
        public var kind: String
        /// A usable value is held (always, for fixed credentials).
        public var hasToken: Bool
        /// Seconds until the held token expires (negative once past); `nil` without expiry.
        public var expiresInSeconds: Double?
        public var refreshing: Bool
        public var lastRefresh: LastRefresh?
        public var consecutiveFailures: Int
        /// Seconds until the next refresh may be attempted after failures; `nil`: any time.
        public var nextAttemptInSeconds: Double?
        /// With `store:`: the token shared by every replica, and how the latest one was had.
        public var fleet: Fleet?

        enum CodingKeys: String, CodingKey {
            case name, kind, refreshing
            case hasToken = "has_token"
            case expiresInSeconds = "expires_in_seconds"
            case lastRefresh = "last_refresh"
            case consecutiveFailures = "consecutive_failures"
            case nextAttemptInSeconds = "next_attempt_in_seconds"
            case fleet
        }
    }

    /// A credential whose token every replica shares (`store:`).
    public struct Fleet: Sendable, Encodable, Equatable {
        /// The `stores.NAME`.
        public var store: String
        /// How the latest token was had: `shared` (another replica fetched it; `lease_wait`: while
        /// this one waited on its lease), `fetched` (this
        /// replica fetched it for all), `fallback` (fetched here alone: the store failed or the
        /// wait for a peer ran out); `nil` before the first.
        public var lastToken: String?

        enum CodingKeys: String, CodingKey {
            case store
            case lastToken = "last_token"
        }
    }

    /// The fleet part of a credential's entry, when its tokens are shared.
    public static func fleet(of manager: TokenManager) -> Fleet? {
        guard let shared = manager.source as? SharedTokenSource else { return nil }
        return Fleet(store: shared.storeName, lastToken: shared.lastOutcome?.rawValue)
    }

    /// How the last refresh ended.
    public struct LastRefresh: Sendable, Encodable, Equatable {
        public var secondsAgo: Double
        /// Wall-clock time, RFC 3339.
        public var at: String
        public var ok: Bool
        /// The token endpoint's failure (`TokenEndpointError.description`), when it failed.
        public var error: String?

        enum CodingKeys: String, CodingKey {
            case at, ok, error
            case secondsAgo = "seconds_ago"
        }
    }

    public var credentials: [Entry]

    /// Asks every credential of `runtime` (token managers answer from their actor, never waiting on a refresh).
    public static func collect(from runtime: GatewayRuntime, now: Date = Date()) async -> CredentialReport {
        var entries: [Entry] = []
        for name in runtime.credentials.names {
            let kind = runtime.config.credentials[name]?.typeName ?? "unknown"
            guard let oauth = runtime.credentials.provider(named: name) as? OAuth2CredentialProvider else {
                entries.append(Entry(name: name, kind: kind, hasToken: true, refreshing: false, consecutiveFailures: 0))
                continue
            }
            var entry = entry(name: name, kind: kind, status: await oauth.manager.status, now: now)
            entry.fleet = fleet(of: oauth.manager)
            entries.append(entry)
        }
        return CredentialReport(credentials: entries)
    }

    static func entry(name: String, kind: String, status: TokenManager.Status, now: Date) -> Entry {
        let observed = status.observedAt ?? .now
        func seconds(until instant: ContinuousClock.Instant?) -> Double? {
            instant.map { observed.duration(to: $0).secondsValue }
        }
        let last = status.lastRefresh.map { instant -> LastRefresh in
            let ago = instant.duration(to: observed).secondsValue
            return LastRefresh(secondsAgo: ago, at: now.addingTimeInterval(-ago).formatted(.iso8601),
                               ok: status.lastError == nil, error: status.lastError?.description)
        }
        return Entry(name: name, kind: kind, hasToken: status.hasToken, expiresInSeconds: seconds(until: status.expiry),
                     refreshing: status.refreshing, lastRefresh: last, consecutiveFailures: status.consecutiveFailures,
                     nextAttemptInSeconds: seconds(until: status.nextAttempt).map { max(0, $0) })
    }

    /// `portico_token_expiry_seconds` counting down: recorded from each token's expiry when
    /// `/metrics` is scraped, not only when the token was fetched (0 without a token).
    public func recordExpiryGauges(factory: any MetricsFactory = MetricsSystem.factory) {
        for entry in credentials where entry.kind.hasPrefix("oauth2") {
            Gauge(label: "portico_token_expiry_seconds", dimensions: [("credential", entry.name)], factory: factory)
                .record(max(0, entry.expiresInSeconds ?? 0))
        }
    }
}
