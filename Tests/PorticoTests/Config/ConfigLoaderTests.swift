import Foundation
import Logging
import Portico
import Testing

@Suite("ConfigLoader: valid files")
struct ConfigLoaderTests {
    @Test("a minimal file gets every default")
    func defaults() throws {
        let config = try load(minimalRoute)
        #expect(config.source == "portico.yaml")
        #expect(config.listen == ListenConfig())
        #expect(config.admin == AdminConfig())
        #expect(config.logging == LoggingConfig())
        #expect(config.defaults == DefaultsConfig())
        #expect(config.upstreams.isEmpty && config.credentials.isEmpty && config.middleware.isEmpty)
        #expect(config.routes == [RouteConfig(name: "ping", match: .init(path: "/ping"),
                                              direct: .init(status: 200, body: "pong"))])
    }

    @Test("listen.threads defaults to one per core, and `auto` says the same")
    func automaticThreads() throws {
        let expected = ListenConfig.automaticThreads
        #expect(expected >= 1 && expected <= ProcessInfo.processInfo.processorCount)
        #expect(try load(minimalRoute).listen.threads == expected)
        #expect(try load("listen: { threads: auto }\n" + minimalRoute).listen.threads == expected)
        #expect(try load("listen: { threads: 3 }\n" + minimalRoute).listen.threads == 3)
    }

    @Test("every section is read into the model")
    func fullFile() throws {
        let config = try load("""
            listen:
              address: 127.0.0.1
              port: 0
              threads: 2
              connection_limit: 50
              idle_timeout: 5s
              request_timeout: 1500ms
              header_timeout: 3s
              max_in_flight: 100
              max_header_bytes: 16KiB
              max_body_bytes: 1MB
              drain_delay: 2s
              shutdown_grace: 1m
            admin: { enabled: false, address: 0.0.0.0, port: 9000 }
            logging: { level: debug, format: logfmt }
            upstreams:
              orders:
                url: https://orders.example.com/base
                transport: nio
                connect_timeout: 1s
                timeout: 3s
                max_connections: 8
                idle_timeout: 1500ms
                preserve_host: true
                max_response_bytes: 2MiB
            credentials:
              key: { type: static, header: X-Api-Key, value: abc }
              basic: { type: basic, username: u, password: p }
              cc:
                type: oauth2_client_credentials
                token_url: http://idp.local/token?tenant=1
                client_id: id
                client_secret: secret
                client_auth: client_secret_post
                scope: a b
                audience: aud
                extra_params: { resource: r }
                refresh_before_expiry: 10s
                default_lifetime: 1h
                timeout: 2s
              rt:
                type: oauth2_refresh_token
                token_url: http://idp.local/token
                client_id: id
                client_secret: secret
                refresh_token: rtok
            middleware:
              log: { type: access_log, redact_headers: [Authorization], redact_query: [token], include_headers: [User-Agent] }
              auth: { type: auth, credential: cc, client_header: keep_if_present }
            defaults:
              middleware: [log, auth]
            routes:
              - name: orders
                match: { path_prefix: /orders/, host: "*.Example.com", methods: [get, Post] }
                upstream: orders
                strip_prefix: true
                middleware: []
                timeout: 2s
              - name: ping
                match: { path: /ping }
                direct:
                  status: 201
                  body: "pong\\n"
                  headers: { Content-Type: text/plain, x-b: "2", x-a: "1" }
            """)
        var listen = ListenConfig()
        listen.address = "127.0.0.1"
        listen.port = 0
        listen.threads = 2
        listen.connectionLimit = 50
        listen.idleTimeout = .seconds(5)
        listen.requestTimeout = .milliseconds(1500)
        listen.headerTimeout = .seconds(3)
        listen.maxInFlight = 100
        listen.maxHeaderBytes = 16 * 1024
        listen.maxBodyBytes = 1_000_000
        listen.drainDelay = .seconds(2)
        listen.shutdownGrace = .seconds(60)
        #expect(config.listen == listen)
        #expect(config.admin.enabled == false && config.admin.address == "0.0.0.0" && config.admin.port == 9000)
        #expect(config.logging.level == Logger.Level.debug && config.logging.format == .logfmt)

        var orders = UpstreamConfig(name: "orders", url: URL(string: "https://orders.example.com/base")!)
        orders.transport = .nio
        orders.connectTimeout = .seconds(1)
        orders.timeout = .seconds(3)
        orders.maxConnections = 8
        orders.idleTimeout = .milliseconds(1500)
        orders.preserveHost = true
        orders.maxResponseBytes = 2 * 1024 * 1024
        #expect(config.upstreams == ["orders": orders])

        #expect(config.credentials["key"]?.kind == .staticHeader(header: "X-Api-Key", value: "abc"))
        #expect(config.credentials["basic"]?.kind == .basic(username: "u", password: "p"))
        var oauth = OAuth2Config(tokenURL: URL(string: "http://idp.local/token?tenant=1")!, clientID: "id", clientSecret: "secret")
        oauth.clientAuth = .clientSecretPost
        oauth.scope = "a b"
        oauth.audience = "aud"
        oauth.extraParams = ["resource": "r"]
        var cc = CredentialConfig(kind: .oauth2ClientCredentials(oauth))
        cc.refreshBeforeExpiry = .seconds(10)
        cc.defaultLifetime = .seconds(3600)
        cc.timeout = .seconds(2)
        #expect(config.credentials["cc"] == cc)
        let rtOAuth = OAuth2Config(tokenURL: URL(string: "http://idp.local/token")!, clientID: "id", clientSecret: "secret")
        #expect(config.credentials["rt"] == CredentialConfig(kind: .oauth2RefreshToken(rtOAuth, refreshToken: "rtok")))

        var log = AccessLogConfig()
        log.redactHeaders = ["authorization"]
        log.redactQuery = ["token"]
        log.includeHeaders = ["user-agent"]
        #expect(config.middleware["log"] == .accessLog(log))
        #expect(config.middleware["auth"] == .auth(AuthConfig(credential: "cc", clientHeader: .keepIfPresent)))
        #expect(config.defaults.middleware == ["log", "auth"])

        #expect(config.routes.count == 2)
        #expect(config.routes[0] == RouteConfig(
            name: "orders", match: .init(pathPrefix: "/orders/", host: "*.example.com", methods: ["GET", "POST"]),
            upstream: "orders", stripPrefix: true, middleware: [], timeout: .seconds(2)))
        #expect(config.routes[1].middleware == nil)
        let direct = try #require(config.routes[1].direct)
        #expect(direct.status == 201)
        #expect(direct.body == "pong\n")
        #expect(direct.headers.map(\.0) == ["Content-Type", "x-b", "x-a"])
        #expect(direct.headers.map(\.1) == ["text/plain", "2", "1"])
    }

    @Test("sections may come in any order; references resolve forwards")
    func sectionOrder() throws {
        let config = try load("""
            routes:
              - name: r
                match: { path_prefix: / }
                upstream: u
                middleware: [a]
            middleware:
              a: { type: auth, credential: c }
            credentials:
              c: { type: static, value: "Bearer x" }
            upstreams:
              u: { url: "http://u:1" }
            """)
        #expect(config.routes[0].middleware == ["a"])
        #expect(config.credentials["c"]?.kind == .staticHeader(header: "Authorization", value: "Bearer x"))
    }

    @Test("YAML anchors and merge keys work")
    func anchors() throws {
        let config = try load("""
            upstreams:
              a: &base { url: "http://a:1", timeout: 3s }
              b:
                <<: *base
                url: http://b:2
            \(minimalRoute)
            """)
        #expect(config.upstreams["b"]?.url.absoluteString == "http://b:2")
        #expect(config.upstreams["b"]?.timeout == .seconds(3))
    }

    @Test("load(file:) reads a file and names it as given")
    func loadFile() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("portico.yaml").path
        try "listen: { port: nope }\n\(minimalRoute)\n".write(toFile: path, atomically: true, encoding: .utf8)
        do throws(ConfigError) {
            _ = try ConfigLoader.load(file: path, environment: [:])
            Issue.record("expected an error")
        } catch {
            #expect(error.description == "\(path):1 listen.port: expected an integer, got \"nope\"")
        }
        let missing = directory.appendingPathComponent("missing.yaml").path
        #expect(throws: ConfigError(diagnostics: [ConfigDiagnostic(
            file: missing, line: nil, path: "", message: "cannot read configuration file (no such file)")])) {
            try ConfigLoader.load(file: missing, environment: [:])
        }
    }
}
