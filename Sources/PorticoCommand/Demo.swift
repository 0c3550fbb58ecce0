import ArgumentParser
import Foundation
import Logging
import Portico
import PorticoTesting

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the gateway on an embedded configuration with an in-process demo upstream.")

    @Option(help: "Port for the gateway.")
    var port: Int = 8080

    @Option(help: "Port for the admin listener (/metrics, /healthz, /readyz).")
    var adminPort: Int = 9901

    /// The embedded configuration. It goes through the same loader as a file, with the demo
    /// upstream's port interpolated from the environment.
    static let yaml = """
    # portico demo: a gateway in front of an in-process orders API.
    listen:
      address: 127.0.0.1
      port: ${DEMO_PORT}
      request_timeout: 10s
    admin:
      address: 127.0.0.1
      port: ${DEMO_ADMIN_PORT}
    logging:
      level: info
      format: logfmt
    upstreams:
      orders:
        url: http://127.0.0.1:${DEMO_UPSTREAM_PORT}
        transport: urlsession
        timeout: 5s
      orders-nio:
        url: http://127.0.0.1:${DEMO_UPSTREAM_PORT}
        transport: nio
    credentials:
      demo-idp:
        type: oauth2_client_credentials
        token_url: ${DEMO_TOKEN_URL}
        client_id: portico
        client_secret: ${DEMO_CLIENT_SECRET}
        scope: reports.read
        refresh_before_expiry: 10s
    middleware:
      log:
        type: access_log
        redact_query: [token]
      limit:
        type: rate_limit
        key: client_ip
        rate: 5/s
        burst: 10
      retry:
        type: retry
        attempts: 3
        backoff: { base: 25ms, cap: 250ms }
      auth:
        type: auth
        credential: demo-idp
      gzip:
        type: compress
      cache:
        type: cache
        max_bytes: 16MiB
    defaults:
      middleware: [log, limit, retry]
    routes:
      - name: ping
        match: { path: /ping }
        direct: { status: 200, body: "pong\\n", headers: { content-type: text/plain } }
      - name: orders
        match: { path_prefix: /orders }
        upstream: orders
      - name: echo
        match: { path_prefix: /echo }
        upstream: orders
      - name: reports
        match: { path_prefix: /secure }
        upstream: orders
        middleware: [log, retry, auth]
      - name: catalog
        match: { path: /catalog }
        upstream: orders-nio
        middleware: [log, limit, gzip, cache]
      - name: flaky
        match: { path: /flaky }
        upstream: orders
      - name: fast
        match: { path_prefix: /fast/ }
        upstream: orders-nio
        strip_prefix: true
    """

    func run() async throws {
        // A demo identity provider with short-lived tokens (so refreshes show in the log) and
        // an upstream that only accepts its current tokens on /secure.
        var idpSettings = TestTokenEndpoint.Configuration()
        idpSettings.clientSecret = "demo-client-secret"
        idpSettings.expiresIn = 30
        let idp = try TestTokenEndpoint(idpSettings)
        let upstream = DemoUpstream(authorizes: { idp.authorizes($0) })
        let upstreamPort = try upstream.start()
        var environment = ProcessInfo.processInfo.environment
        environment["DEMO_PORT"] = String(port)
        environment["DEMO_UPSTREAM_PORT"] = String(upstreamPort)
        environment["DEMO_ADMIN_PORT"] = String(adminPort)
        environment["DEMO_TOKEN_URL"] = idp.url.absoluteString
        environment["DEMO_CLIENT_SECRET"] = idpSettings.clientSecret
        let config = try Bootstrap.loadOrExit("embedded demo configuration: ") { () throws(ConfigError) in
            try ConfigLoader.load(yaml: Self.yaml, source: "<demo>", environment: environment)
        }
        Bootstrap.logging(config.logging)
        let registry = Bootstrap.metrics()
        let logger = Logger(label: "portico")
        try await Serve.run(config: config, file: nil, logger: logger, registry: registry) { port in
            let banner = """

            Portico demo: gateway on http://127.0.0.1:\(port), demo upstream on 127.0.0.1:\(upstreamPort).
            Try:
              curl -i http://127.0.0.1:\(port)/ping
              curl -i http://127.0.0.1:\(port)/orders
              curl -i http://127.0.0.1:\(port)/orders/2
              curl -i -X POST --data '{"item":"gadget"}' http://127.0.0.1:\(port)/orders
              curl -i 'http://127.0.0.1:\(port)/echo/anything?token=secret&page=2'   (see the token redacted in the access log)
              curl -i http://127.0.0.1:\(port)/fast/orders/1                       (same upstream over the NIO transport)
              curl -i http://127.0.0.1:\(port)/secure/report                       (a bearer token injected; refreshed every ~20 s)
              curl -i http://127.0.0.1:\(port)/flaky                               (503 twice, retried: the client sees 200)
              curl -si http://127.0.0.1:\(port)/catalog | grep -iE 'cache-status|x-upstream-served'   (twice: a hit, served once upstream)
              curl -s -H 'Accept-Encoding: gzip' -o /dev/null -w '%{size_download} bytes\\n' http://127.0.0.1:\(port)/catalog   (gzip on the fly)
              for i in $(seq 15); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:\(port)/ping; done   (429 past 10)
              curl -i http://127.0.0.1:\(port)/nowhere                              (JSON 404 with a request id)
              curl -s http://127.0.0.1:\(adminPort)/metrics | grep portico_requests_total
            Ctrl-C drains and stops.


            """
            FileHandle.standardOutput.write(Data(banner.utf8))
        }
        await upstream.stop()
        await idp.stop()
    }
}
