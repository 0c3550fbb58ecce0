/// `type: auth`. Its state is the credential's token, which the `CredentialStore` carries over a
/// reload whenever the credential's own settings did not change, whatever happened to this.
struct AuthKind: MiddlewareKind {
    let typeName = "auth"

    func parse(_ section: ConfigMapping, names: ConfigNames) -> AuthConfig? {
        AuthConfig.parse(section, names: names)
    }

    func make(name: String, settings: AuthConfig, previous: AuthMiddleware?,
              context: MiddlewareBuildContext) throws -> AuthMiddleware {
        guard let provider = context.credentials.provider(named: settings.credential) else {
            throw GatewayRuntime.BuildError(description: "middleware \(name): unknown credential \"\(settings.credential)\"")
        }
        return AuthMiddleware(provider: provider, clientHeader: settings.clientHeader)
    }
}

extension MiddlewareConfig {
    /// `type: auth`
    public static func auth(_ settings: AuthConfig) -> MiddlewareConfig {
        MiddlewareConfig(AuthKind(), settings)
    }
}
