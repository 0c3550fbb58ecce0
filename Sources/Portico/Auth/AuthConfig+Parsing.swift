extension AuthConfig {
    /// `type: auth` — `credential` must name an entry of `credentials:`.
    static func parse(_ m: ConfigMapping, names: ConfigNames) -> AuthConfig? {
        let credential = m.required("credential")?.reference(to: "credential", among: names.credentials)
        var policy = ClientHeaderPolicy.override
        m.read("client_header", into: &policy) { $0.choice(ClientHeaderPolicy.self) }
        return credential.map { AuthConfig(credential: $0, clientHeader: policy) }
    }
}
