import Foundation
import Portico

/// What `portico demo` runs: an identity provider with short-lived tokens, the demo upstream,
/// the embedded configuration in front of them, and the lines it prints to try. Here rather
/// than in the command so the tests run the very same configuration and lines.
public final class DemoSetup: Sendable {
    public let idp: TokenEndpointServer
    public let upstream: DemoUpstream
    public let upstreamPort: Int
    /// The second demo upstream: with the first, the endpoints of `orders-pair` (failover).
    public let spare: DemoUpstream
    public let sparePort: Int
    private let clientSecret: String

    /// Starts the identity provider and the upstream on free loopback ports.
    public init() throws {
        // Short-lived tokens, so refreshes show in the log; the upstream only accepts current
        // ones on /secure.
        var idpSettings = TokenEndpointServer.Configuration()
        idpSettings.clientSecret = "demo-client-secret"
        idpSettings.expiresIn = 30
        let idp = try TokenEndpointServer(idpSettings)
        self.idp = idp
        clientSecret = idpSettings.clientSecret
        upstream = DemoUpstream(authorizes: { idp.authorizes($0) },
                                switchIdP: { up in try? await idp.setFailure(up ? nil : .closed) })
        upstreamPort = try upstream.start()
        spare = DemoUpstream(name: "spare")
        sparePort = try spare.start()
    }

    public func stop() async {
        await upstream.stop()
        await spare.stop()
        await idp.stop()
    }

    /// The embedded configuration for a gateway on `port` with its admin listener on `adminPort`;
    /// with `tracingEndpoint`, spans go to that OTLP/HTTP collector (`portico demo --tracing-endpoint`).
    public func config(port: Int, adminPort: Int, tracingEndpoint: String? = nil,
                       environment: [String: String] = ProcessInfo.processInfo.environment) throws(ConfigError) -> PorticoConfig {
        var environment = environment
        var yaml = Self.yaml
        if let tracingEndpoint {
            environment["DEMO_TRACING_ENDPOINT"] = tracingEndpoint
            yaml += "\n" + Self.tracingYAML
        }
        environment["DEMO_PORT"] = String(port)
        environment["DEMO_UPSTREAM_PORT"] = String(upstreamPort)
        environment["DEMO_SPARE_PORT"] = String(sparePort)
        environment["DEMO_ADMIN_PORT"] = String(adminPort)
        environment["DEMO_TOKEN_URL"] = idp.url.absoluteString
        environment["DEMO_CLIENT_SECRET"] = clientSecret
        return try ConfigLoader.load(yaml: yaml, source: "<demo>", environment: environment)
    }

    /// Added to `yaml` when the demo exports traces: batches leave every 200 ms, so a trace
    /// shows in the collector about as soon as the request is answered.
    public static let tracingYAML = """
    tracing:
      endpoint: ${DEMO_TRACING_ENDPOINT}
      service_name: portico-demo
      schedule_delay: 200ms
    """

    /// The embedded configuration. It goes through the same loader as a file, with the ports
    /// and the identity provider interpolated from the environment.
    ///
    /// Rate limiting has a route of its own (`/limited`), keyed by a header each printed run
    /// sets afresh: no other line ever meets a 429, and the limit line shows its 10 and then
    /// 429s however often the lines are pasted.
    public static let yaml = """
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
      orders-pair:
        endpoints: ["http://127.0.0.1:${DEMO_UPSTREAM_PORT}", "http://127.0.0.1:${DEMO_SPARE_PORT}"]
        transport: nio
        outlier_detection: { consecutive_failures: 2, base_ejection: 10s }
      orders-spare:
        url: http://127.0.0.1:${DEMO_SPARE_PORT}
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
        key: header:X-Demo-Run
        rate: 10/m
        burst: 10
      paced:
        type: rate_limit
        key: header:X-Demo-Run
        rate: 5/s
        burst: 2
        on_limit: wait
        max_wait: 3s
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
      middleware: [log, retry]
    routes:
      - name: ping
        match: { path: /ping }
        direct: { status: 200, body: "pong\\n", headers: { content-type: text/plain } }
      - name: limited
        match: { path: /limited }
        direct: { status: 200, body: "ok\\n", headers: { content-type: text/plain } }
        middleware: [log, limit]
      - name: paced
        match: { path: /paced }
        direct: { status: 200, body: "ok\\n", headers: { content-type: text/plain } }
        middleware: [log, paced]
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
        middleware: [log, gzip, cache]
      - name: flaky
        match: { path: /flaky }
        upstream: orders
      - name: events
        match: { path: /events }
        upstream: orders-nio
        stream_idle_timeout: 30s
      - name: fast
        match: { path_prefix: /fast/ }
        upstream: orders-nio
        strip_prefix: true
      - name: pair
        match: { path_prefix: /pair/ }
        upstream: orders-pair
        strip_prefix: true
        middleware: [log, retry]
      - name: spare
        match: { path_prefix: /spare/ }
        upstream: orders-spare
        strip_prefix: true
        middleware: [log]
      - name: websocket
        match: { path: /ws/echo }
        upstream: orders-nio
        websocket: true
        middleware: [log]
    """

    /// One line the demo prints: a shell command that can be pasted as it is, again and again.
    public struct Line: Sendable {
        /// Printed as a `#` comment above the command.
        public var note: String?
        public var command: String
        /// A regular expression the command's whole output matches, however often it runs (for tests).
        public var expected: String
        /// Whether it asks the admin listener (which the tests do not start).
        public var usesAdmin = false
    }

    /// The lines to try against a gateway on `port` and an admin listener on `adminPort`.
    /// `python`: an interpreter with Python's websockets for the WebSocket line (scripts/demo sets
    /// one up in .build/demo-python); without it the line runs `python3` and says what it needs.
    public static func lines(port: Int, adminPort: Int, python: String? = nil) -> [Line] {
        let base = "http://127.0.0.1:\(port)"
        let ok = #"HTTP/1\.1 200 OK\r\n[\s\S]*\r\n\r\n"#
        return [
            Line(command: "curl -i \(base)/ping", expected: ok + #"pong\n"#),
            Line(command: "curl -i \(base)/orders", expected: ok + #"\{"orders":\[.*\]\}\n"#),
            Line(command: "curl -i \(base)/orders/2", expected: ok + #"\{"id":2,.*\}\n"#),
            Line(command: #"curl -i -X POST --data '{"item":"gadget"}' \#(base)/orders"#,
                 expected: #"HTTP/1\.1 201 Created\r\n[\s\S]*\r\n\r\n\{"id":4,"received_bytes":17\}\n"#),
            Line(note: "the token is redacted in the access log",
                 command: "curl -i '\(base)/echo/anything?token=secret&page=2'",
                 expected: ok + #"\{.*"target":"\\?/echo\\?/anything\?token=secret&page=2".*\}\n"#),
            Line(note: "the same upstream over the NIO transport", command: "curl -i \(base)/fast/orders/1",
                 expected: ok + #"\{"id":1,.*\}\n"#),
            Line(note: "a bearer token injected; refreshed every ~20 s", command: "curl -i \(base)/secure/report",
                 expected: ok + #"\{.*"secret_report".*\}\n"#),
            Line(note: "the upstream answers 503 twice, the retry hides it: the client sees 200",
                 command: "curl -i \(base)/flaky", expected: ok + #"\{.*"ok":true.*\}\n"#),
            Line(note: "retried and authenticated: with --tracing-endpoint, its trace shows the token fetch and each attempt",
                 command: "curl -i -H 'traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01' \(base)/secure/flaky",
                 expected: ok + #"\{.*"secret_report".*\}\n"#),
            Line(note: "run it twice: the second is a hit, served once upstream",
                 command: "curl -si \(base)/catalog | grep -iE 'cache-status|x-upstream-served'",
                 expected: #"(?i)(cache-status: portico; [^\r\n]*\r\n|x-upstream-served: \d+\r\n){2}"#),
            Line(note: "gzip on the fly",
                 command: #"curl -s -H 'Accept-Encoding: gzip' -o /dev/null -w '%{size_download} bytes\n' \#(base)/catalog"#,
                 expected: #"\d{3} bytes\n"#),
            Line(note: "Server-Sent Events streamed through as they come, one a second (-N: curl prints each at once)",
                 command: "curl -N '\(base)/events?count=3'",
                 expected: #"(id: \d\nevent: tick\ndata: \{"n":\d,"of":3\}\n\n){3}"#),
            Line(note: "rate limit: 10 at once, then 429; each run keys its own bucket (X-Demo-Run)",
                 command: #"run=$(date +%s%N); for i in $(seq 15); do curl -s -o /dev/null -w '%{http_code} ' -H "X-Demo-Run: $run" \#(base)/limited; done; echo"#,
                 expected: "(200 ){10}(429 ){5}\n"),
            Line(note: "on_limit: wait: 5/s, burst 2 — beyond the burst a request waits for its token (~0.2 s each) instead of a 429",
                 command: #"run=$(date +%s%N); for i in $(seq 8); do curl -s -o /dev/null -w '%{http_code}/%{time_total}s ' -H "X-Demo-Run: $run" \#(base)/paced; done; echo"#,
                 expected: #"(200/[0-9.]+s ){8}\n"#),
            Line(note: "failover: two demo upstreams behind orders-pair, in turn (X-Demo-Upstream says which served)",
                 command: "for i in 1 2 3 4; do curl -si \(base)/pair/orders | grep -i '^x-demo-upstream'; done",
                 expected: #"(?i)(x-demo-upstream: (primary|spare)\r\n){4}"#),
            Line(note: "stop one (it answers 503 from now on): the retry sends each request to the other, and it is ejected",
                 command: "curl -s -X POST \(base)/spare/demo/down", expected: #"spare stopped[^\n]*\n"#),
            Line(note: "every request still succeeds while the spare is down (see it ejected: GET /upstreams on the admin port)",
                 command: #"for i in 1 2 3 4; do curl -s -o /dev/null -w '%{http_code} ' \#(base)/pair/orders; done; echo"#,
                 expected: #"(200 ){4}\n"#),
            Line(note: "start it again: it takes traffic once its ejection (10 s) ends",
                 command: "curl -s -X POST \(base)/spare/demo/up", expected: #"spare started again\n"#),
            Line(note: "each endpoint: state, ejection until when and why, in flight, last failure",
                 command: "curl -s http://127.0.0.1:\(adminPort)/upstreams", expected: #"\{"upstreams":[\s\S]*\}\n"#,
                 usesAdmin: true),
            // One statement, so that `with` (websockets 14+ deprecates a connection used without
            // it) fits on one pasteable line.
            Line(note: python == nil ? "a WebSocket echo through Portico (needs Python's websockets: pip install websockets)"
                                     : "a WebSocket echo through Portico (Python's websockets, set up by scripts/demo)",
                 command: Self.quoted(python ?? "python3")
                     + #" -c 'with __import__("websockets.sync.client").sync.client.connect("ws://127.0.0.1:\#(port)/ws/echo") as ws: ws.send("hello"); print(ws.recv())'"#,
                 expected: "hello\n"),
            Line(note: "a JSON 404 with a request id", command: "curl -i \(base)/nowhere",
                 expected: #"HTTP/1\.1 404 Not Found\r\n[\s\S]*\r\n\r\n\{"error":"not_found",.*"request_id":".+"\}\n"#),
            Line(note: "every request above, counted by route, method and status",
                 command: "curl -s http://127.0.0.1:\(adminPort)/metrics | grep portico_requests_total",
                 expected: #"[\s\S]*portico_requests_total[\s\S]*"#, usesAdmin: true),
        ]
    }

    /// `path` as one shell word: as it is when it needs no quoting, else in single quotes.
    static func quoted(_ path: String) -> String {
        let plain = path.unicodeScalars.allSatisfy { CharacterSet.alphanumerics.contains($0) || "/._-+".unicodeScalars.contains($0) }
        return plain ? path : "'" + path.replacingOccurrences(of: "'", with: #"'\''"#) + "'"
    }

    /// What `portico demo` prints once it serves (`python`: as for `lines`).
    public static func banner(port: Int, adminPort: Int, upstreamPort: Int, python: String? = nil) -> String {
        var text = """

        Portico demo: gateway on http://127.0.0.1:\(port), demo upstream on 127.0.0.1:\(upstreamPort), \
        admin on http://127.0.0.1:\(adminPort).
        Try these (paste them as they are, as often as you like):

        """
        for line in lines(port: port, adminPort: adminPort, python: python) {
            if let note = line.note { text += "  # \(note)\n" }
            text += "  \(line.command)\n"
        }
        text += "Ctrl-C drains and stops.\n\n"
        return text
    }
}
