import Logging
import Synchronization

/// One provider per configured credential, built with the runtime.
///
/// A reload builds a new store with `previous:` the old one: credentials whose configuration
/// did not change keep their provider (and so their token and its background refresh).
/// Providers are shared between stores and counted; the last store to let go shuts one down.
public final class CredentialStore: Sendable {
    public struct BuildError: Error, CustomStringConvertible {
        public var description: String
    }

    /// A provider and how many stores hold it.
    final class Handle: Sendable {
        let config: CredentialConfig
        /// The settings of the store its token is shared on: a changed store is a new provider.
        let storeConfig: StoreConfig?
        let provider: any CredentialProvider
        private let owners = OwnerCount()

        init(config: CredentialConfig, storeConfig: StoreConfig?, provider: any CredentialProvider) {
            self.config = config
            self.storeConfig = storeConfig
            self.provider = provider
        }

        /// Takes a share, unless the provider has been shut down already.
        func retain() -> Bool { owners.retain() }

        /// Gives a share back; `true` for the last one (the caller shuts the provider down).
        func release() -> Bool { owners.release() }
    }

    private let handles: [String: Handle]
    private let released = Mutex(false)

    /// Builds providers for `credentials`, reusing `previous`'s for unchanged configurations.
    /// `stores`: where credentials with `store:` share their token.
    public init(credentials: [String: CredentialConfig], previous: CredentialStore? = nil,
                stores: RateLimitStores = RateLimitStores(), logger: Logger, clock: any GatewayClock = SystemClock(),
                tokenOptions: TokenManager.Options = TokenManager.Options()) throws {
        var handles: [String: Handle] = [:]
        do {
            for name in credentials.keys.sorted() {
                let config = credentials[name]!
                let backend = try config.store.map { storeName in
                    guard let backend = stores.backend(named: storeName) else {
                        throw BuildError(description: "credential \(name): unknown store \"\(storeName)\"")
                    }
                    return backend
                }
                if let old = previous?.handles[name], old.config == config, old.storeConfig == backend?.config, old.retain() {
                    handles[name] = old
                    continue
                }
                let provider = try Self.makeProvider(name: name, config, backend: backend, logger: logger, clock: clock,
                                                     tokenOptions: tokenOptions)
                handles[name] = Handle(config: config, storeConfig: backend?.config, provider: provider)
            }
        } catch {
            Self.release(Array(handles.values))
            throw error
        }
        self.handles = handles
    }

    public convenience init(config: PorticoConfig, previous: CredentialStore? = nil,
                            stores: RateLimitStores = RateLimitStores(), logger: Logger,
                            clock: any GatewayClock = SystemClock(),
                            tokenOptions: TokenManager.Options = TokenManager.Options()) throws {
        try self.init(credentials: config.credentials, previous: previous, stores: stores, logger: logger, clock: clock,
                      tokenOptions: tokenOptions)
    }

    public func provider(named name: String) -> (any CredentialProvider)? {
        handles[name]?.provider
    }

    public var names: [String] { handles.keys.sorted() }

    /// Lets go of every provider; those no newer store reused stop their background refresh.
    /// Idempotent.
    public func shutdown() async {
        let first = released.withLock { released in
            defer { released = true }
            return !released
        }
        guard first else { return }
        for handle in handles.values where handle.release() {
            await handle.provider.shutdown()
        }
    }

    /// For a store that never came into service (its runtime failed to build).
    func discard() {
        let first = released.withLock { released in
            defer { released = true }
            return !released
        }
        guard first else { return }
        Self.release(Array(handles.values))
    }

    private static func release(_ handles: [Handle]) {
        let last = handles.filter { $0.release() }.map(\.provider)
        guard !last.isEmpty else { return }
        Task {
            for provider in last { await provider.shutdown() }
        }
    }

    static func makeProvider(name: String, _ config: CredentialConfig, backend: RedisBucketStore? = nil, logger: Logger,
                             clock: any GatewayClock, tokenOptions: TokenManager.Options) throws -> any CredentialProvider {
        /// The token endpoint, or the store in front of it when the token is shared.
        func source(_ client: TokenEndpointClient, _ oauth: OAuth2Config) -> any TokenSource {
            guard let backend, let keys = config.encryptionKeys else { return client }
            return SharedTokenSource(credential: name, inner: client, backend: backend, keys: keys,
                                     identity: SharedTokenSource.identity(of: oauth), clock: clock, timeout: config.timeout,
                                     defaultLifetime: config.defaultLifetime, logger: logger)
        }
        switch config.kind {
        case .staticHeader(let header, let value):
            guard let provider = StaticHeaderProvider(name: name, header: header, value: value) else {
                throw BuildError(description: "credential \(name): \"\(header)\" is not a valid header name")
            }
            return provider
        case .basic(let username, let password):
            return BasicAuthProvider(name: name, username: username, password: password)
        case .oauth2ClientCredentials(let oauth):
            let tokenOptions = tokenOptions.backingOff(base: config.backoffBase, cap: config.backoffCap)
            let client = TokenEndpointClient(config: oauth, grant: .clientCredentials, timeout: config.timeout)
            return OAuth2CredentialProvider(manager: TokenManager(
                name: name, source: source(client, oauth), clock: clock, refreshBeforeExpiry: config.refreshBeforeExpiry,
                defaultLifetime: config.defaultLifetime, timeout: config.timeout, options: tokenOptions, logger: logger))
        case .oauth2RefreshToken(let oauth, let refreshToken):
            let tokenOptions = tokenOptions.backingOff(base: config.backoffBase, cap: config.backoffCap)
            let client = TokenEndpointClient(config: oauth, grant: .refreshToken, timeout: config.timeout)
            return OAuth2CredentialProvider(manager: TokenManager(
                name: name, source: source(client, oauth), clock: clock, refreshBeforeExpiry: config.refreshBeforeExpiry,
                defaultLifetime: config.defaultLifetime, timeout: config.timeout, refreshToken: refreshToken,
                options: tokenOptions, logger: logger))
        }
    }
}
