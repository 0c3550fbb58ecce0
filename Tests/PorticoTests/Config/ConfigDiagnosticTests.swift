import Portico
import Testing

/// Each error class, with the exact text a user sees (line numbers included).
@Suite("ConfigLoader: diagnostics")
struct ConfigDiagnosticTests {
    @Test("the design's example: unknown upstream with a suggestion")
    func unknownUpstream() {
        #expect(diagnostics("""
            upstreams:
              orders: { url: "http://127.0.0.1:9000" }
            routes:
              - name: orders
                match: { path_prefix: /orders/ }
                upstream: order
            """) == [#"portico.yaml:6 routes[0].upstream: unknown upstream "order" (did you mean "orders"?)"#])
    }

    @Test("a description without a line omits it; an empty path omits the key path")
    func descriptionFormat() {
        #expect(ConfigDiagnostic(file: "config/portico.yaml", line: nil, path: "routes", message: "no routes defined")
            .description == "config/portico.yaml routes: no routes defined")
        #expect(ConfigDiagnostic(file: "portico.yaml", line: 3, path: "", message: "invalid YAML: x")
            .description == "portico.yaml:3: invalid YAML: x")
        let error = ConfigError(diagnostics: [
            ConfigDiagnostic(file: "a.yaml", line: 1, path: "x", message: "one"),
            ConfigDiagnostic(file: "a.yaml", line: 2, path: "y", message: "two"),
        ])
        #expect(error.description == "a.yaml:1 x: one\na.yaml:2 y: two")
    }

    @Test("YAML syntax errors become one diagnostic at libyaml's line")
    func syntaxError() {
        #expect(diagnostics("""
            listen:
              port: 8080
             address: x
            """) == ["portico.yaml:3: invalid YAML: did not find expected key (while parsing a block mapping at line 1)"])
        #expect(diagnostics("""
            routes:
              - name: "unterminated
            """) == ["portico.yaml:2: invalid YAML: found unexpected end of stream (while scanning a quoted scalar at line 2)"])
    }

    @Test("duplicate keys are reported")
    func duplicateKey() {
        #expect(diagnostics("""
            listen:
              port: 1
              port: 2
            \(minimalRoute)
            """) == [#"portico.yaml:2: duplicate key "port""#])
    }

    @Test("the top level must be a mapping")
    func topLevelNotMapping() {
        #expect(diagnostics("- a\n- b\n") == ["portico.yaml:1: expected a mapping, got a list"])
    }

    @Test("unknown keys at every level, with suggestions only when close")
    func unknownKeys() {
        #expect(diagnostics("""
            listn: {}
            listen: { prot: 80, foo: 1 }
            upstreams:
              u: { url: "http://u", tiemout: 1s }
            routes:
              - name: r
                match: { path_prefx: /, path: /x }
                upstream: u
                middlewares: []
            """) == [
            #"portico.yaml:1 listn: unknown key "listn" (did you mean "listen"?)"#,
            #"portico.yaml:2 listen.prot: unknown key "prot" (did you mean "port"?)"#,
            #"portico.yaml:2 listen.foo: unknown key "foo""#,
            #"portico.yaml:4 upstreams.u.tiemout: unknown key "tiemout" (did you mean "timeout"?)"#,
            #"portico.yaml:7 routes[0].match.path_prefx: unknown key "path_prefx" (did you mean "path_prefix"?)"#,
            #"portico.yaml:9 routes[0].middlewares: unknown key "middlewares" (did you mean "middleware"?)"#,
        ])
    }

    @Test("wrong types name the expected type")
    func wrongTypes() {
        #expect(diagnostics("""
            listen:
              port: abc
              threads: [1]
            admin: [enabled]
            logging:
              level: { a: 1 }
            upstreams:
              u:
                url: "http://u"
                preserve_host: maybe
            routes: { name: r }
            """) == [
            #"portico.yaml:2 listen.port: expected an integer, got "abc""#,
            "portico.yaml:3 listen.threads: expected an integer or auto, got a list",
            "portico.yaml:4 admin: expected a mapping, got a list",
            "portico.yaml:6 logging.level: expected one of trace, debug, info, notice, warning, error, critical, got a mapping",
            #"portico.yaml:10 upstreams.u.preserve_host: expected true or false, got "maybe""#,
            "portico.yaml:11 routes: expected a list, got a mapping",
        ])
    }

    @Test("ranges and enumerations")
    func rangesAndChoices() {
        #expect(diagnostics("""
            listen: { port: 70000, threads: 0, connection_limit: -1 }
            admin: { port: -5 }
            logging: { level: verbose, format: jsn }
            \(minimalRoute)
            """) == [
            "portico.yaml:1 listen.port: must be between 0 and 65535, got 70000",
            "portico.yaml:1 listen.threads: must be between 1 and 1024, got 0",
            "portico.yaml:1 listen.connection_limit: must be at least 1, got -1",
            "portico.yaml:2 admin.port: must be between 0 and 65535, got -5",
            #"portico.yaml:3 logging.level: expected one of trace, debug, info, notice, warning, error, critical, got "verbose""#,
            #"portico.yaml:3 logging.format: expected one of json, logfmt, got "jsn" (did you mean "json"?)"#,
        ])
    }

    @Test("durations and sizes")
    func units() {
        #expect(diagnostics("""
            listen:
              idle_timeout: 10x
              request_timeout: 0
              drain_delay: -1s
              max_body_bytes: 10 megs
              max_header_bytes: 0
            \(minimalRoute)
            """) == [
            #"portico.yaml:2 listen.idle_timeout: invalid duration "10x" (expected e.g. 250ms, 10s, 5m)"#,
            "portico.yaml:3 listen.request_timeout: must be greater than 0",
            #"portico.yaml:4 listen.drain_delay: invalid duration "-1s" (must not be negative)"#,
            #"portico.yaml:5 listen.max_body_bytes: invalid size "10 megs" (expected e.g. 512B, 64KiB, 10MiB, 1GB)"#,
            "portico.yaml:6 listen.max_header_bytes: must be greater than 0",
        ])
    }

    @Test("upstream URLs and options")
    func upstreamURLs() {
        #expect(diagnostics("""
            upstreams:
              a: { url: "ftp://a" }
              b: { url: "http://" }
              c: { url: "http://c/x?q=1" }
              d: { url: "http://d/#frag" }
              e: { url: "not a url" }
              f: { transport: grpc, max_connections: 0 }
              g: { url: "http://user:pw@g" }
              h: { url: "http://h", idle_timeout: 2s }
              i: { url: "http://i", transport: nio, idle_timeout: 0 }
            \(minimalRoute)
            """) == [
            #"portico.yaml:2 upstreams.a.url: invalid URL "ftp://a" (scheme must be http or https)"#,
            #"portico.yaml:3 upstreams.b.url: invalid URL "http://" (URL has no host)"#,
            #"portico.yaml:4 upstreams.c.url: invalid URL "http://c/x?q=1" (URL must not have a query)"#,
            #"portico.yaml:5 upstreams.d.url: invalid URL "http://d/#frag" (URL must not have a fragment)"#,
            #"portico.yaml:6 upstreams.e.url: invalid URL "not a url" (expected an absolute URL such as http://127.0.0.1:9000)"#,
            #"portico.yaml:7 upstreams.f: missing required key "url""#,
            #"portico.yaml:7 upstreams.f.transport: expected one of urlsession, nio, got "grpc""#,
            "portico.yaml:7 upstreams.f.max_connections: must be at least 1, got 0",
            "portico.yaml:8 upstreams.g.url: URL must not contain a user name or password (put them in credentials:)",
            "portico.yaml:9 upstreams.h.idle_timeout: the urlsession transport keeps idle connections as libcurl decides; "
                + "use transport: nio to set it",
            "portico.yaml:10 upstreams.i.idle_timeout: must be greater than 0",
        ])
    }

    @Test("credentials: types, required keys, header safety")
    func credentials() {
        #expect(diagnostics("""
            credentials:
              a: { type: oauth2 }
              b: { type: static, header: "X Key", value: "v" }
              c: { type: static, value: "a\\r\\nInjected: 1" }
              d: { type: basic, username: "a:b", password: p }
              e: { type: oauth2_client_credentials, client_id: x, client_auth: basic }
              f: { type: static, value: v, timeout: 1s }
              g: { value: v }
              h: { type: oauth2_refresh_token, token_url: "http://idp", client_id: i, client_secret: s, timeout: 0 }
            \(minimalRoute)
            """) == [
            #"portico.yaml:2 credentials.a.type: expected one of static, basic, oauth2_client_credentials, oauth2_refresh_token, got "oauth2""#,
            #"portico.yaml:3 credentials.b.header: invalid header name "X Key""#,
            "portico.yaml:4 credentials.c.value: header value must not contain CR, LF or NUL",
            #"portico.yaml:5 credentials.d.username: must not contain ":""#,
            #"portico.yaml:6 credentials.e: missing required key "token_url""#,
            #"portico.yaml:6 credentials.e: missing required key "client_secret""#,
            #"portico.yaml:6 credentials.e.client_auth: expected one of client_secret_basic, client_secret_post, got "basic""#,
            #"portico.yaml:7 credentials.f.timeout: unknown key "timeout""#,
            #"portico.yaml:8 credentials.g: missing required key "type""#,
            #"portico.yaml:9 credentials.h: missing required key "refresh_token""#,
            "portico.yaml:9 credentials.h.timeout: must be greater than 0",
        ])
    }

    @Test("middleware: unknown type lists the supported ones; auth needs a known credential")
    func middleware() {
        #expect(diagnostics("""
            credentials:
              idp: { type: static, value: v }
            middleware:
              a: { type: acces_log }
              b: { type: cache, max_bytes: 1MiB, max_object_bytes: 2MiB }
              c: { type: auth, credential: ipd }
              d: { type: auth }
              e: { type: access_log, redact_headers: ["bad header"], client_header: keep }
              f: { type: auth, credential: idp, client_header: keep }
            \(minimalRoute)
            """) == [
            #"portico.yaml:4 middleware.a.type: unknown middleware type "acces_log" (did you mean "access_log"?); supported: access_log, auth, cache, compress, headers, quota, rate_limit, retry"#,
            #"portico.yaml:5 middleware.b.max_object_bytes: must not be greater than max_bytes"#,
            #"portico.yaml:6 middleware.c.credential: unknown credential "ipd" (did you mean "idp"?)"#,
            #"portico.yaml:7 middleware.d: missing required key "credential""#,
            #"portico.yaml:8 middleware.e.redact_headers[0]: invalid header name "bad header""#,
            #"portico.yaml:8 middleware.e.client_header: unknown key "client_header""#,
            #"portico.yaml:9 middleware.f.client_header: expected one of override, keep_if_present, got "keep""#,
        ])
    }

    @Test("middleware lists: unknown names and duplicates")
    func middlewareLists() {
        #expect(diagnostics("""
            middleware:
              log: { type: access_log }
            defaults:
              middleware: [log, lgo]
            routes:
              - name: r
                match: { path: /r }
                direct: {}
                middleware:
                  - log
                  - log
            """) == [
            #"portico.yaml:4 defaults.middleware[1]: unknown middleware "lgo" (did you mean "log"?)"#,
            #"portico.yaml:11 routes[0].middleware[1]: duplicate middleware "log" in this list"#,
        ])
    }

    @Test("routes: required keys, upstream xor direct, match rules")
    func routes() {
        #expect(diagnostics("""
            upstreams:
              u: { url: "http://u" }
            routes:
              - match: { path: /a }
                upstream: u
              - name: both
                match: { path: /b }
                upstream: u
                direct: {}
              - name: neither
                match: { host: example.com }
              - name: empty-match
                match: { methods: [GET] }
                upstream: u
              - name: paths
                match: { path: x, path_prefix: /y }
                upstream: u
              - name: methods
                match: { path_prefix: /m, methods: ["GET", "BAD METHOD", get], host: "example.com:80" }
                upstream: u
              - name: strip
                match: { path: /s }
                upstream: u
                strip_prefix: true
                timeout: 0s
            """) == [
            #"portico.yaml:4 routes[0]: missing required key "name""#,
            "portico.yaml:6 routes[1]: set either upstream or direct, not both",
            "portico.yaml:10 routes[2]: needs either upstream or direct",
            "portico.yaml:13 routes[3].match: needs at least one of path, path_prefix, host",
            #"portico.yaml:16 routes[4].match.path: must start with "/", got "x""#,
            "portico.yaml:16 routes[4].match: path and path_prefix cannot both be set (path is an exact match)",
            #"portico.yaml:19 routes[5].match.host: invalid host "example.com:80" (expected e.g. api.example.com or *.example.com, without port)"#,
            #"portico.yaml:19 routes[5].match.methods[1]: invalid HTTP method "BAD METHOD""#,
            #"portico.yaml:19 routes[5].match.methods[2]: duplicate method "GET""#,
            "portico.yaml:24 routes[6].strip_prefix: requires match.path_prefix",
            "portico.yaml:25 routes[6].timeout: must be greater than 0",
        ])
    }

    @Test("duplicate route names point at the first one")
    func duplicateRouteNames() {
        #expect(diagnostics("""
            routes:
              - name: a
                match: { path: /a }
                direct: {}
              - name: a
                match: { path: /b }
                direct: {}
            """) == [#"portico.yaml:5 routes[1].name: duplicate route name "a" (first defined at line 2)"#])
    }

    @Test("direct responses: status range, header names, response splitting, framing headers")
    func direct() {
        #expect(diagnostics("""
            routes:
              - name: d
                match: { path: /d }
                direct:
                  status: 700
                  headers:
                    "bad name": x
                    x-ok: "a\\nb"
                    Content-Length: "5"
              - name: e
                match: { path: /e }
                direct: { status: 204, body: "no" }
            """) == [
            "portico.yaml:5 routes[0].direct.status: must be between 100 and 599, got 700",
            #"portico.yaml:7 routes[0].direct.headers["bad name"]: invalid header name "bad name""#,
            "portico.yaml:8 routes[0].direct.headers.x-ok: header value must not contain CR, LF or NUL",
            #"portico.yaml:9 routes[0].direct.headers.Content-Length: header "Content-Length" is set by Portico and cannot be configured"#,
            "portico.yaml:12 routes[1].direct.body: must be empty for status 204",
        ])
    }

    @Test("no routes: absent, empty, or an empty file")
    func noRoutes() {
        // Every message has a line: an absent section is a missing key of the file's top mapping.
        #expect(diagnostics("listen: {}\n") == [#"portico.yaml:1: missing required key "routes""#])
        #expect(diagnostics("# comment\nlisten: {}\n") == [#"portico.yaml:2: missing required key "routes""#])
        #expect(diagnostics("listen: {}\nroutes: []\n") == ["portico.yaml:2 routes: no routes defined"])
        #expect(diagnostics("listen: {}\nroutes:\n") == ["portico.yaml:2 routes: no routes defined"])
        #expect(diagnostics("") == [#"portico.yaml:1: the file is empty: missing required key "routes""#])
        #expect(diagnostics("# only a comment\n") == [#"portico.yaml:1: the file is empty: missing required key "routes""#])
    }

    @Test("a missing key is reported at the line of the key holding the mapping, not at its first child")
    func missingKeyLine() {
        #expect(diagnostics("""
            upstreams:
              orders:
                timeout: 1s
            routes:
              - match: { path: /a }
                direct: {}
              - name: b
                direct: {}
                match:
                  methods: [GET]
            """) == [
            #"portico.yaml:2 upstreams.orders: missing required key "url""#,
            #"portico.yaml:5 routes[0]: missing required key "name""#,
            "portico.yaml:9 routes[1].match: needs at least one of path, path_prefix, host",
        ])
    }

    @Test("null for a required value and for a section")
    func nulls() {
        #expect(diagnostics("""
            upstreams:
              u:
            routes:
              - name:
                match: { path: / }
                direct: {}
            """) == [
            "portico.yaml:2 upstreams.u: expected a mapping, got null",
            "portico.yaml:4 routes[0].name: expected a string, got null",
        ])
    }

    @Test("admin and proxy listeners cannot share a port")
    func adminPortConflict() {
        #expect(diagnostics("""
            listen: { port: 9000 }
            admin: { port: 9000 }
            \(minimalRoute)
            """) == ["portico.yaml:2 admin.port: port 9000 is already used by listen.port"])
        // admin.port left at its default: the line of listen.port, not a message without one.
        #expect(diagnostics("""
            listen: { port: 9901 }
            \(minimalRoute)
            """) == ["portico.yaml:1 listen.port: port 9901 is also the admin listener's default (admin.port): set another admin.port"])
        #expect(diagnostics("""
            listen: { port: 9000 }
            admin: { port: 9000, enabled: false }
            \(minimalRoute)
            """) == [])
    }

    @Test("portico check's summary counts in singular and plural")
    func summary() throws {
        let one = try ConfigLoader.load(yaml: """
            upstreams: { u: { url: "http://u" } }
            credentials: { c: { type: static, value: v } }
            middleware: { log: { type: access_log } }
            \(minimalRoute)
            """, environment: [:])
        #expect(one.summary == "1 route, 1 upstream, 1 middleware, 1 credential")
        var two = one
        two.routes += one.routes
        two.upstreams["v"] = one.upstreams["u"]
        two.credentials["d"] = one.credentials["c"]
        two.middleware["log2"] = one.middleware["log"]
        #expect(two.summary == "2 routes, 2 upstreams, 2 middleware, 2 credentials")
        #expect(PorticoConfig().summary == "0 routes, 0 upstreams, 0 middleware, 0 credentials")
    }

    @Test("all problems are reported at once, in file order")
    func manyAtOnce() {
        let found = diagnostics("""
            routes:
              - name: r
                match: { path: /r }
                upstream: nope
            listen:
              port: abc
            logging: { level: loud }
            """)
        #expect(found == [
            #"portico.yaml:4 routes[0].upstream: unknown upstream "nope""#,
            #"portico.yaml:6 listen.port: expected an integer, got "abc""#,
            #"portico.yaml:7 logging.level: expected one of trace, debug, info, notice, warning, error, critical, got "loud""#,
        ])
    }
}
