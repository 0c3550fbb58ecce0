import Portico
import Testing

/// Interpolated values may be secrets: no message may contain them, whatever goes wrong.
@Suite("ConfigLoader: secrets stay out of errors")
struct SecretSafetyTests {
    static let secret = "hunter2-TOP-SECRET"

    @Test("messages say `value from ${VAR}`, never the value", arguments: [
        ("listen: { port: \"${S}\" }", #"portico.yaml:1 listen.port: expected an integer, got value from ${S}"#),
        ("listen: { idle_timeout: \"${S}\" }",
         #"portico.yaml:1 listen.idle_timeout: invalid duration value from ${S} (expected e.g. 250ms, 10s, 5m)"#),
        ("listen: { max_body_bytes: \"${S}\" }",
         #"portico.yaml:1 listen.max_body_bytes: invalid size value from ${S} (expected e.g. 512B, 64KiB, 10MiB, 1GB)"#),
        ("logging: { format: \"x${S}\" }",
         #"portico.yaml:1 logging.format: expected one of json, logfmt, got value from "x${S}""#),
        ("upstreams: { u: { url: \"${S}\" } }",
         #"portico.yaml:1 upstreams.u.url: invalid URL value from ${S} (expected an absolute URL such as http://127.0.0.1:9000)"#),
        ("admin: { enabled: \"${S}\" }", #"portico.yaml:1 admin.enabled: expected true or false, got value from ${S}"#),
        ("credentials: { c: { type: static, header: \"${S} \", value: v } }",
         #"portico.yaml:1 credentials.c.header: invalid header name value from "${S} ""#),
        ("credentials: { c: { type: \"${S}\" } }",
         #"portico.yaml:1 credentials.c.type: expected one of static, basic, oauth2_client_credentials, oauth2_refresh_token, got value from ${S}"#),
        ("middleware: { m: { type: \"${S}\" } }",
         #"portico.yaml:1 middleware.m.type: unknown middleware type value from ${S}; supported: access_log, auth, cache, compress, headers, quota, rate_limit, retry"#),
    ])
    func scalarErrors(yaml: String, expected: String) {
        let found = diagnostics(yaml + "\n" + minimalRoute, environment: ["S": Self.secret])
        #expect(found == [expected])
    }

    @Test("no description of a broken config with secrets in it contains a secret")
    func wholeFile() {
        let environment = ["S": Self.secret, "NEWLINE": "a\r\n\(Self.secret)", "NAME": Self.secret]
        let found = diagnostics("""
            listen: { port: "${S}", threads: "${S}", idle_timeout: "${S}" }
            upstreams:
              u: { url: "http://${S}:99999/x?${S}", transport: "${S}" }
            credentials:
              c: { type: static, value: "${NEWLINE}" }
              o: { type: oauth2_client_credentials, token_url: "${S}", client_id: x, client_secret: "${S}" }
            middleware:
              a: { type: auth, credential: "${S}" }
            routes:
              - name: "${NAME}"
                match: { path: "${S}", methods: ["${S} x"], host: "${S}:1" }
                upstream: "${S}"
                direct: { status: "${S}", headers: { x: "${NEWLINE}" } }
              - name: "${NAME}"
                match: { path: /x }
                direct: {}
            """, environment: environment)
        #expect(found.count >= 14)
        for message in found {
            #expect(!message.contains(Self.secret), "leaked: \(message)")
        }
        #expect(found.contains(#"portico.yaml:14 routes[1].name: duplicate route name value from ${NAME} (first defined at line 10)"#))
    }
}
