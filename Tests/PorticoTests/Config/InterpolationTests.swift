import Foundation
import Portico
import Testing

@Suite("ConfigLoader: interpolation")
struct InterpolationTests {
    private func body(_ value: String, environment: [String: String] = [:]) throws -> String? {
        let config = try load("""
            routes:
              - name: r
                match: { path: /r }
                direct:
                  body: \(value)
            """, environment: environment)
        return config.routes.first?.direct?.body
    }

    @Test("${VAR} takes the environment's value")
    func variable() throws {
        #expect(try body("${GREETING}", environment: ["GREETING": "hello"]) == "hello")
        #expect(try body("\"<${A}|${B}>\"", environment: ["A": "1", "B": "2"]) == "<1|2>")
    }

    @Test("${VAR:-default} falls back when unset or empty")
    func defaults() throws {
        #expect(try body("${GREETING:-hi there}") == "hi there")
        #expect(try body("${GREETING:-hi}", environment: ["GREETING": ""]) == "hi")
        #expect(try body("${GREETING:-hi}", environment: ["GREETING": "yo"]) == "yo")
        #expect(try body("\"${GREETING:-}\"") == "")
        #expect(try body("${URL:-http://x:1/a}") == "http://x:1/a")
    }

    @Test("values with YAML syntax stay plain text: interpolation runs after parsing")
    func yamlSafe() throws {
        let tricky = "a: b # not a comment\n- [x]"
        #expect(try body("${SECRET}", environment: ["SECRET": tricky]) == tricky)
    }

    @Test("$${ is a literal ${ and a lone $ is kept")
    func escape() throws {
        #expect(try body("\"$${HOME} costs $5 $$\"", environment: ["HOME": "/root"]) == "${HOME} costs $5 $$")
    }

    @Test("interpolation also feeds typed values")
    func typed() throws {
        let config = try load("""
            listen: { port: "${PORT:-8081}", request_timeout: "${TIMEOUT}" }
            \(minimalRoute)
            """, environment: ["TIMEOUT": "5s"])
        #expect(config.listen.port == 8081)
        #expect(config.listen.requestTimeout == .seconds(5))
    }

    @Test("${file:/path} reads the file and trims one trailing newline")
    func file() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let secret = directory.appendingPathComponent("secret").path
        try "s3cr:et #x\n\n".write(toFile: secret, atomically: true, encoding: .utf8)
        #expect(try body("${file:\(secret)}") == "s3cr:et #x\n")

        // Relative paths start at the config file's directory.
        let configPath = directory.appendingPathComponent("portico.yaml").path
        try """
            credentials:
              c: { type: static, value: "Bearer ${file:secret}" }
            \(minimalRoute)
            """.write(toFile: configPath, atomically: true, encoding: .utf8)
        try "token\n".write(toFile: secret, atomically: true, encoding: .utf8)
        let config = try ConfigLoader.load(file: configPath, environment: [:])
        #expect(config.credentials["c"]?.kind == .staticHeader(header: "Authorization", value: "Bearer token"))
    }

    @Test("a secret with CR, LF or NUL in it is refused at its key, without repeating it")
    func secretWithLineBreak() {
        let found = diagnostics("""
            credentials:
              c: { type: static, value: "Bearer ${API_KEY}" }
              d: { type: static, header: X-Key, value: "${NUL_KEY}" }
            \(minimalRoute)
            """, environment: ["API_KEY": "abc\r\nX-Injected: 1", "NUL_KEY": "abc\u{0}def"])
        #expect(found == [
            "portico.yaml:2 credentials.c.value: header value must not contain CR, LF or NUL",
            "portico.yaml:3 credentials.d.value: header value must not contain CR, LF or NUL",
        ])
        #expect(!found.joined().contains("abc"))
    }

    @Test("a missing variable without a default is reported at its key")
    func missingVariable() {
        #expect(diagnostics("""
            credentials:
              c:
                type: static
                value: ${API_KEY}
            listen: { port: "${PORT}${PORT2:-}" }
            \(minimalRoute)
            """) == [
            #"portico.yaml:4 credentials.c.value: environment variable "API_KEY" is not set"#,
            #"portico.yaml:5 listen.port: environment variable "PORT" is not set"#,
        ])
    }

    @Test("an unreadable file is reported by path")
    func unreadableFile() {
        #expect(diagnostics("""
            credentials:
              c: { type: static, value: "${file:/nonexistent/portico/secret}" }
              d: { type: static, value: "${file:/}" }
            \(minimalRoute)
            """) == [
            #"portico.yaml:2 credentials.c.value: cannot read file "/nonexistent/portico/secret" (no such file)"#,
            #"portico.yaml:3 credentials.d.value: cannot read file "/" (is a directory)"#,
        ])
    }

    @Test("malformed references")
    func malformed() {
        #expect(diagnostics("""
            routes:
              - name: "${1BAD}"
                match: { path: "/${OPEN" }
                direct: { body: "${file:}" }
            """) == [
            #"portico.yaml:2 routes[0].name: invalid reference "${1BAD}" (expected ${NAME}, ${NAME:-default} or ${file:/path})"#,
            #"portico.yaml:3 routes[0].match.path: unterminated "${" (write "$${" for a literal "${")"#,
            #"portico.yaml:4 routes[0].direct.body: empty file path in "${file:}""#,
        ])
    }
}
