import Foundation

extension CredentialConfig {
    static let supportedTypes = ["static", "basic", "oauth2_client_credentials", "oauth2_refresh_token"]

    /// `credentials.NAME`, dispatched on `type:`.
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> CredentialConfig? {
        guard let type = m.required("type")?.choice(supportedTypes) else {
            return nil  // keys depend on the type: checking them would only add noise
        }
        let kind: Kind?
        var extras = TokenTiming()
        switch type {
        case "static":
            kind = parseStatic(m)
        case "basic":
            kind = parseBasic(m)
        case "oauth2_client_credentials":
            let oauth = OAuth2Config.parse(m)
            extras = parseTokenTiming(m, names: names)
            kind = oauth.map { .oauth2ClientCredentials($0) }
        default:  // "oauth2_refresh_token"
            let oauth = OAuth2Config.parse(m)
            let refreshToken = m.required("refresh_token")?.nonEmptyString()
            extras = parseTokenTiming(m, names: names)
            if let oauth, let refreshToken {
                kind = .oauth2RefreshToken(oauth, refreshToken: refreshToken)
            } else {
                kind = nil
            }
        }
        m.finish()
        guard let kind else { return nil }
        var c = CredentialConfig(kind: kind)
        if let value = extras.refreshBeforeExpiry { c.refreshBeforeExpiry = value }
        if let value = extras.defaultLifetime { c.defaultLifetime = value }
        if let value = extras.timeout { c.timeout = value }
        if let value = extras.backoffBase { c.backoffBase = value }
        if let value = extras.backoffCap { c.backoffCap = value }
        c.store = extras.store
        c.encryptionKeys = extras.encryptionKeys
        if c.backoffCap < c.backoffBase {
            let culprit = extras.backoffCap != nil ? m.value("backoff_cap") : m.value("backoff_base")
            culprit?.error("backoff_cap must not be below backoff_base")
            return nil
        }
        return c
    }

    /// `type: static` — a fixed header; `header` defaults to `Authorization`.
    private static func parseStatic(_ m: ConfigMapping) -> Kind? {
        var header = "Authorization"
        m.read("header", into: &header) { $0.headerName() }
        guard let valueNode = m.required("value"), let value = valueNode.headerValue() else { return nil }
        guard !value.isEmpty else {
            valueNode.error("must not be empty")
            return nil
        }
        return .staticHeader(header: header, value: value)
    }

    /// `type: basic` — RFC 7617 forbids `:` in the user name.
    private static func parseBasic(_ m: ConfigMapping) -> Kind? {
        let usernameNode = m.required("username")
        var username = usernameNode?.nonEmptyString()
        if let name = username, name.contains(":") {
            usernameNode?.error("must not contain \":\"")
            username = nil
        }
        let password = m.required("password")?.string()
        guard let username, let password else { return nil }
        return .basic(username: username, password: password)
    }

    struct TokenTiming {
        var refreshBeforeExpiry: Duration?
        var defaultLifetime: Duration?
        var timeout: Duration?
        var backoffBase: Duration?
        var backoffCap: Duration?
        var store: String?
        var encryptionKeys: TokenEncryptionKeys?
    }

    /// Token timing keys, only meaningful (and only accepted) for the OAuth2 kinds.
    private static func parseTokenTiming(_ m: ConfigMapping, names: ConfigNames) -> TokenTiming {
        var result = TokenTiming()
        m.read("store", into: &result.store) { $0.reference(to: "store", among: names.stores) }
        m.read("encryption_key", into: &result.encryptionKeys) { $0.encryptionKeys() }
        if m.value("store") != nil, m.value("encryption_key") == nil {
            m.value("store")?.error("needs encryption_key: a shared token is a secret, sealed before it is stored "
                                     + "(32 random bytes in base64, e.g. from `openssl rand -base64 32`)")
        }
        if m.value("encryption_key") != nil, m.value("store") == nil {
            m.value("encryption_key")?.error("applies only with store: NAME (a token shared with the other replicas)")
        }
        m.read("refresh_before_expiry", into: &result.refreshBeforeExpiry) { $0.duration() }
        m.read("default_lifetime", into: &result.defaultLifetime) { $0.duration(positive: true) }
        m.read("timeout", into: &result.timeout) { $0.duration(positive: true) }
        m.read("backoff_base", into: &result.backoffBase) { $0.duration(positive: true) }
        m.read("backoff_cap", into: &result.backoffCap) { $0.duration(positive: true) }
        return result
    }
}

extension OAuth2Config {
    /// The keys shared by both OAuth2 grant types.
    static func parse(_ m: ConfigMapping) -> OAuth2Config? {
        let tokenURL = m.required("token_url")?.url(allowQuery: true)
        let clientID = m.required("client_id")?.nonEmptyString()
        let clientSecret = m.required("client_secret")?.nonEmptyString()
        var clientAuth = ClientAuthMethod.clientSecretBasic
        m.read("client_auth", into: &clientAuth) { $0.choice(ClientAuthMethod.self) }
        var scope: String?, audience: String?
        m.read("scope", into: &scope) { $0.string() }
        m.read("audience", into: &audience) { $0.string() }
        var extraParams: [String: String] = [:]
        m.read("extra_params", into: &extraParams) { node in
            guard let params = node.mapping() else { return nil }
            var result: [String: String] = [:]
            for entry in params.entries {
                if let value = entry.value.string() { result[entry.key] = value }
            }
            return result
        }
        var transport = UpstreamConfig.Transport.urlsession
        m.read("transport", into: &transport) { $0.choice(UpstreamConfig.Transport.self) }
        var tls = TLSClientConfig()
        if let tlsNode = m.value("tls"), let section = tlsNode.mapping() {
            tls = TLSClientConfig.parse(section, transport: transport)
            if let tokenURL, tokenURL.scheme?.lowercased() != "https" {
                tlsNode.error("applies to https:// token URLs only")
            }
        }
        guard let tokenURL, let clientID, let clientSecret else { return nil }
        var c = OAuth2Config(tokenURL: tokenURL, clientID: clientID, clientSecret: clientSecret)
        c.clientAuth = clientAuth
        c.scope = scope
        c.audience = audience
        c.extraParams = extraParams
        c.transport = transport
        c.tls = tls
        return c
    }
}

extension ConfigNode {
    /// `encryption_key`: one base64 key of 32 bytes, or a list of them (the first seals, all
    /// open). Messages give the length, never the value.
    func encryptionKeys() -> TokenEncryptionKeys? {
        let nodes: [ConfigNode]
        if case .sequence = node {
            guard let items = list(), !items.isEmpty else {
                error("must list at least one key")
                return nil
            }
            nodes = items
        } else {
            nodes = [self]
        }
        var keys: [[UInt8]] = []
        for item in nodes {
            guard let text = item.scalar(expected: "a base64 key")?.text else { return nil }
            guard let bytes = Data(base64Encoded: text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
                item.error("is not base64; expected 32 random bytes in base64 (openssl rand -base64 32)")
                return nil
            }
            guard bytes.count == 32 else {
                item.error("is \(bytes.count) bytes; an AES-256 key is 32 bytes (openssl rand -base64 32)")
                return nil
            }
            keys.append(Array(bytes))
        }
        return TokenEncryptionKeys(keys)
    }
}
