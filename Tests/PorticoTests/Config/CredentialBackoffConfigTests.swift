import Portico
import Testing

@Suite("Config: token refresh backoff")
struct CredentialBackoffConfigTests {
    static func credential(_ extra: String, type: String = "oauth2_client_credentials") -> String {
        """
        credentials:
          idp:
            type: \(type)
            token_url: http://127.0.0.1:9/token
            client_id: portico
            client_secret: s3cret
        \(extra.split(separator: "\n").map { "    \($0)" }.joined(separator: "\n"))
        \(minimalRoute)
        """
    }

    @Test("backoff_base and backoff_cap are read; without them 500ms and 30s")
    func read() throws {
        let defaults = try #require(try load(Self.credential("")).credentials["idp"])
        #expect(defaults.backoffBase == .milliseconds(500))
        #expect(defaults.backoffCap == .seconds(30))
        let tuned = try #require(try load(Self.credential("backoff_base: 2s\nbackoff_cap: 5m")).credentials["idp"])
        #expect(tuned.backoffBase == .seconds(2))
        #expect(tuned.backoffCap == .seconds(300))
        let refresh = try load(Self.credential("refresh_token: rt\nbackoff_cap: 10s", type: "oauth2_refresh_token"))
        #expect(refresh.credentials["idp"]?.backoffCap == .seconds(10))
    }

    @Test("a cap below the base, a zero value and a static credential's backoff are errors with their key path")
    func invalid() {
        let below = diagnostics(Self.credential("backoff_base: 10s\nbackoff_cap: 1s"))
        #expect(below.count == 1)
        #expect(below.first?.contains("credentials.idp.backoff_cap") == true)
        #expect(below.first?.contains("must not be below backoff_base") == true)
        // Only a base above the default cap: the base is the key at fault.
        let baseOnly = diagnostics(Self.credential("backoff_base: 1m"))
        #expect(baseOnly.first?.contains("credentials.idp.backoff_base") == true)
        let zero = diagnostics(Self.credential("backoff_cap: 0s"))
        #expect(zero.first?.contains("credentials.idp.backoff_cap") == true)
        let staticKind = diagnostics("""
            credentials:
              key: { type: static, value: abc, backoff_cap: 10s }
            \(minimalRoute)
            """)
        #expect(staticKind.first?.contains("unknown key \"backoff_cap\"") == true)
    }
}
