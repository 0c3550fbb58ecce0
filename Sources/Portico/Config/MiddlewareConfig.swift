/// `middleware.NAME` — a named, reusable instance: a `type:` and that type's settings.
///
/// Made by the loader from the YAML, or in code with the constructor each type offers
/// (`.cache(CacheConfig())`, `.rateLimit(…)`); read back with `settings(as:)`.
public struct MiddlewareConfig: Sendable, Equatable {
    private let typed: any TypedSettings

    init<Kind: MiddlewareKind>(_ kind: Kind, _ settings: Kind.Settings) {
        typed = Typed(kind: kind, settings: settings)
    }

    /// The `type:` string.
    public var typeName: String { typed.typeName }

    /// The settings when they are a `Settings` (`config.middleware["c"]?.settings(as: CacheConfig.self)`),
    /// `nil` for another type.
    public func settings<Settings>(as _: Settings.Type = Settings.self) -> Settings? {
        typed.value as? Settings
    }

    /// Equal when of the same type with equal settings.
    public static func == (a: MiddlewareConfig, b: MiddlewareConfig) -> Bool {
        a.typed.isEqual(to: b.typed)
    }

    /// Builds the instance; `previous` is the one a reload replaces, handed to the type only
    /// when it was built from settings equal to these.
    func makeMiddleware(name: String, previous: (any Middleware)?, context: MiddlewareBuildContext) throws -> any Middleware {
        try typed.make(name: name, previous: previous, context: context)
    }
}

/// The settings with the kind that knows them, so the configuration stays one plain value
/// whatever types are registered.
private protocol TypedSettings: Sendable {
    var typeName: String { get }
    var value: any Sendable { get }
    func isEqual(to other: any TypedSettings) -> Bool
    func make(name: String, previous: (any Middleware)?, context: MiddlewareBuildContext) throws -> any Middleware
}

private struct Typed<Kind: MiddlewareKind>: TypedSettings {
    let kind: Kind
    let settings: Kind.Settings

    var typeName: String { kind.typeName }
    var value: any Sendable { settings }

    func isEqual(to other: any TypedSettings) -> Bool {
        guard let other = other as? Typed<Kind> else { return false }
        return other.typeName == typeName && other.settings == settings
    }

    func make(name: String, previous: (any Middleware)?, context: MiddlewareBuildContext) throws -> any Middleware {
        try kind.make(name: name, settings: settings, previous: previous as? Kind.Instance, context: context)
    }
}
