import Logging

/// One `type:` of `middleware.NAME`, whole: its word, how its section parses, how an instance
/// is built, and what a reload hands over from the instance it replaces. Each lives in its
/// feature's folder (`CacheKind` in `Cache/`); `MiddlewareRegistry.standard` lists them.
///
/// ```swift
/// struct StampKind: MiddlewareKind {
///     let typeName = "stamp"
///     func parse(_ section: ConfigMapping, names: ConfigNames) -> String? {
///         section.required("value")?.nonEmptyString()
///     }
///     func make(name: String, settings: String, previous: Stamp?, context: MiddlewareBuildContext) -> Stamp {
///         Stamp(value: settings)
///     }
/// }
/// ```
protocol MiddlewareKind: Sendable {
    /// The parsed section: an immutable value, compared on reload.
    associatedtype Settings: Sendable & Equatable
    associatedtype Instance: Middleware

    /// The `type:` word.
    var typeName: String { get }

    /// Reads `middleware.NAME` once its `type:` is known. Problems are reported on the nodes
    /// (so they carry file, line and key path) and make it return `nil`; keys it never asks
    /// for are reported as unknown afterwards.
    func parse(_ section: ConfigMapping, names: ConfigNames) -> Settings?

    /// The instance for `middleware.NAME`. `previous` is the instance a reload replaces when
    /// it had the same name, type and settings: whatever state it holds (stored responses,
    /// token buckets, a retry budget) should carry over. `nil` at start and whenever the
    /// settings changed, so a changed middleware starts afresh.
    func make(name: String, settings: Settings, previous: Instance?, context: MiddlewareBuildContext) throws -> Instance
}

/// What building a middleware may use besides its own settings.
struct MiddlewareBuildContext {
    var logger: Logger
    var clock: any GatewayClock
    /// The runtime's credentials (unchanged ones already carry their tokens over).
    var credentials: CredentialStore
    /// The runtime's shared rate-limit stores (unchanged ones keep their connections).
    var stores = RateLimitStores()
}
