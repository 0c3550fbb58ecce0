import Foundation
import Logging
import Portico
import PorticoTesting
import Synchronization
import Testing

/// Log lines captured in memory, as the executable would write them.
final class CapturedLines: Sendable {
    private let lines = Mutex<[String]>([])
    func append(_ line: String) { lines.withLock { $0.append(line) } }
    var all: [String] { lines.withLock { $0 } }

    func logger(format: LoggingConfig.Format) -> Logger {
        Logger(label: "portico") { label in
            StructuredLogHandler(label: label, format: format, level: .info) { self.append($0) }
        }
    }
}

@Suite("Access log")
struct AccessLogTests {
    static let secret = "s3cr3t-api-key-value"

    static func config(upstream: TestUpstream) -> PorticoConfig {
        var config = PorticoConfig()
        config.upstreams = ["up": UpstreamConfig(name: "up", url: URL(string: "http://127.0.0.1:\(upstream.port)")!)]
        config.credentials = ["api": CredentialConfig(kind: .staticHeader(header: "Authorization", value: "Bearer \(secret)"))]
        var log = AccessLogConfig()
        log.redactQuery = ["token"]
        log.includeHeaders = ["user-agent", "authorization"]
        config.middleware = ["log": .accessLog(log), "auth": .auth(AuthConfig(credential: "api"))]
        config.defaults.middleware = ["log", "auth"]
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api"), upstream: "up")]
        return config
    }

    @Test("one JSON line per request with the expected fields; secrets, tokens and redacted values never appear")
    func jsonLines() async throws {
        let upstream = TestUpstream()
        try await upstream.start()
        let captured = CapturedLines()
        let gateway = try TestGateway(Self.config(upstream: upstream), logger: captured.logger(format: .json))
        let response = try await gateway.request("POST", "/api/items?token=client-query-secret&page=2",
                                                 headers: [("X-Request-ID", "req-42"), ("User-Agent", "itest/2"),
                                                           ("Authorization", "Bearer client-own-token")],
                                                 body: Array("hello".utf8))
        #expect(response.status == 200)
        // The upstream got the injected credential, not the client's.
        let echo = try TestUpstream.Echo.decode(response.body)
        #expect(echo.values("authorization") == ["Bearer \(Self.secret)"])
        await gateway.stop()
        await upstream.shutdown()

        let accessLines = captured.all.filter { $0.contains("\"log\":\"access\"") }
        #expect(accessLines.count == 1)
        let line = try #require(accessLines.first)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        #expect(object["request_id"] as? String == "req-42")
        #expect(object["method"] as? String == "POST")
        #expect(object["path"] as? String == "/api/items?token=[REDACTED]&page=2")
        #expect(object["route"] as? String == "api")
        #expect(object["upstream"] as? String == "up")
        #expect(object["status"] as? Int == 200)
        #expect(object["bytes_in"] as? Int == 5)
        #expect((object["bytes_out"] as? Int ?? 0) > 0)
        #expect(object["attempts"] as? Int == 1)
        #expect(object["credential"] as? String == "api")
        #expect(object["client"] as? String == "127.0.0.1")
        #expect(object["header_user_agent"] as? String == "itest/2")
        #expect(object["header_authorization"] as? String == "[REDACTED]")
        #expect(object["duration_ms"] is Double || object["duration_ms"] is Int)
        #expect(object["upstream_ms"] != nil)
        #expect(object["ts"] as? String != nil)
        for captured in captured.all {
            #expect(!captured.contains(Self.secret))
            #expect(!captured.contains("client-query-secret"))
            #expect(!captured.contains("client-own-token"))
        }
    }

    @Test("logfmt lines carry the same fields and quote values with spaces")
    func logfmt() async throws {
        let upstream = TestUpstream()
        try await upstream.start()
        let captured = CapturedLines()
        let gateway = try TestGateway(Self.config(upstream: upstream), logger: captured.logger(format: .logfmt))
        _ = try await gateway.request("GET", "/api/x", headers: [("User-Agent", "a b c")])
        await gateway.stop()
        await upstream.shutdown()
        let line = try #require(captured.all.first { $0.contains("log=access") })
        #expect(line.contains(" method=GET "))
        #expect(line.contains(" status=200"))
        #expect(line.contains(" header_user_agent=\"a b c\""))
        #expect(!line.contains(Self.secret))
    }
}

/// The access log's `bytes_out` and status for answers Portico makes itself.
@Suite("Access log: Portico's own answers")
struct AccessLogOwnAnswerTests {
    /// The access line of the request with `requestID`.
    static func line(_ capture: LogCapture, _ requestID: String) throws -> Logger.Metadata {
        try #require(capture.records.first { $0["request_id"]?.description == requestID }, "no access line for \(requestID)")
    }

    @Test("bytes_out is the body sent: 429, 502, 504, direct routes, HEAD (none)")
    func bytesOutOfOwnAnswers() async throws {
        let upstream = TestUpstream()
        upstream.route("/slow", TestUpstream.Response.text("late").delayed(by: .seconds(5)))
        try await upstream.start()
        let refusing = try RefusingPort()
        let config = try ConfigLoader.load(yaml: """
            upstreams:
              up: { url: "http://127.0.0.1:\(upstream.port)", transport: nio, timeout: 300ms }
              down: { url: "http://127.0.0.1:\(refusing.port)", transport: nio }
            middleware:
              log: { type: access_log }
              limit: { type: rate_limit, key: route, rate: 1/h, burst: 1 }
            defaults: { middleware: [log] }
            routes:
              - { name: limited, match: { path: /limited }, direct: { status: 200, body: "ok" }, middleware: [log, limit] }
              - { name: down, match: { path_prefix: /down }, upstream: down }
              - { name: slow, match: { path_prefix: /slow }, upstream: up }
              - { name: ping, match: { path: /ping }, direct: { status: 200, body: "pong" } }
            """, environment: [:])
        let capture = LogCapture(message: "request")
        let gateway = try TestGateway(config, logger: capture.logger)
        var answers: [(id: String, status: Int, bytes: Int)] = []
        for (index, (method, target, status)) in [("GET", "/limited", 200), ("GET", "/limited", 429), ("GET", "/down/x", 502),
                                                  ("GET", "/slow", 504), ("GET", "/ping", 200)].enumerated() {
            let id = "own-\(index)"
            let response = try await gateway.request(method, target, headers: [("X-Request-ID", id)])
            #expect(response.status == status, "\(target)")
            #expect(!response.body.isEmpty, "\(target)")
            answers.append((id, response.status, response.body.count))
        }
        let head = try await gateway.request("HEAD", "/ping", headers: [("X-Request-ID", "own-head")])
        #expect(head.status == 200)
        await gateway.stop()
        await upstream.shutdown()

        for answer in answers {
            let line = try Self.line(capture, answer.id)
            #expect(line["status"]?.description == String(answer.status), "\(answer.id)")
            #expect(line["bytes_out"]?.description == String(answer.bytes), "\(answer.id)")
        }
        #expect(try Self.line(capture, "own-1")["error"]?.description == "rate_limited")
        #expect(try Self.line(capture, "own-head")["bytes_out"]?.description == "0")
    }

    @Test("requests answered before any chain are logged by defaults.middleware's access_log, route empty: 404, 405, 400")
    func unroutedAnswers() async throws {
        let config = try ConfigLoader.load(yaml: """
            middleware:
              log: { type: access_log, redact_query: [token], include_headers: [user-agent] }
            defaults: { middleware: [log] }
            routes:
              - { name: ping, match: { path: /ping, methods: [GET] }, direct: { status: 200, body: "pong" } }
            """, environment: [:])
        let capture = LogCapture(message: "request")
        let gateway = try TestGateway(config, logger: capture.logger)
        let notFound = try await gateway.request("GET", "/nowhere?token=t0p&x=1",
                                                 headers: [("X-Request-ID", "un-404"), ("User-Agent", "itest")])
        #expect(notFound.status == 404)
        let notAllowed = try await gateway.request("DELETE", "/ping", headers: [("X-Request-ID", "un-405")])
        #expect(notAllowed.status == 405)
        let malformed = try await gateway.request("GET", "/a/../ping", headers: [("X-Request-ID", "un-400")])
        #expect(malformed.status == 400)
        let headNotFound = try await gateway.request("HEAD", "/nowhere", headers: [("X-Request-ID", "un-head")])
        #expect(headNotFound.status == 404)
        await gateway.stop()

        let line404 = try Self.line(capture, "un-404")
        #expect(line404["route"]?.description == "")
        #expect(line404["status"]?.description == "404")
        #expect(line404["error"]?.description == "not_found")
        #expect(line404["method"]?.description == "GET")
        #expect(line404["path"]?.description == "/nowhere?token=[REDACTED]&x=1")
        #expect(line404["client"]?.description == "127.0.0.1")
        #expect(line404["header_user_agent"]?.description == "itest")
        #expect(line404["bytes_out"]?.description == String(notFound.body.count))
        let line405 = try Self.line(capture, "un-405")
        #expect(line405["status"]?.description == "405")
        #expect(line405["route"]?.description == "")
        #expect(line405["bytes_out"]?.description == String(notAllowed.body.count))
        let line400 = try Self.line(capture, "un-400")
        #expect(line400["status"]?.description == "400")
        #expect(line400["bytes_out"]?.description == String(malformed.body.count))
        #expect(try Self.line(capture, "un-head")["bytes_out"]?.description == "0")
        #expect(capture.records.count == 4)
    }

    @Test("no access_log in defaults.middleware: unrouted requests write no line")
    func unroutedWithoutDefaultLog() async throws {
        let config = try ConfigLoader.load(yaml: """
            middleware:
              log: { type: access_log }
            routes:
              - { name: ping, match: { path: /ping }, direct: { status: 200, body: "pong" }, middleware: [log] }
            """, environment: [:])
        let capture = LogCapture(message: "request")
        let gateway = try TestGateway(config, logger: capture.logger)
        #expect(try await gateway.request("GET", "/nowhere").status == 404)
        #expect(try await gateway.request("GET", "/ping").status == 200)
        await gateway.stop()
        #expect(capture.records.map { $0["route"]?.description } == ["ping"])
    }

    @Test("a refusal answered before any upstream is asked names no upstream: rate_limit's 429 on a proxied route")
    func refusalNamesNoUpstream() async throws {
        let upstream = TestUpstream()
        try await upstream.start()
        let config = try ConfigLoader.load(yaml: """
            upstreams:
              up: { url: "http://127.0.0.1:\(upstream.port)", transport: nio }
            middleware:
              log: { type: access_log }
              limit: { type: rate_limit, key: route, rate: 1/h, burst: 1 }
            routes:
              - { name: api, match: { path_prefix: /api }, upstream: up, middleware: [log, limit] }
            """, environment: [:])
        let capture = LogCapture(message: "request")
        let gateway = try TestGateway(config, logger: capture.logger)
        #expect(try await gateway.request("GET", "/api/a", headers: [("X-Request-ID", "lim-1")]).status == 200)
        #expect(try await gateway.request("GET", "/api/b", headers: [("X-Request-ID", "lim-2")]).status == 429)
        await gateway.stop()
        await upstream.shutdown()
        let forwarded = try Self.line(capture, "lim-1")
        #expect(forwarded["upstream"]?.description == "up")
        let refused = try Self.line(capture, "lim-2")
        #expect(refused["route"]?.description == "api")
        #expect(refused["error"]?.description == "rate_limited")
        #expect(refused["upstream"] == nil, "no upstream was asked: \(refused)")
        #expect(refused["upstream_ms"] == nil)
        #expect(upstream.totalHits == 1)
    }

    @Test("a route's max_in_flight refusal is logged by that route's access_log, with the route and no upstream")
    func routeOverload() async throws {
        let release = AsyncGate()
        let upstream = TestUpstream()
        upstream.route("/held") { request in
            await release.wait()
            return .echo(request)
        }
        try await upstream.start()
        let config = try ConfigLoader.load(yaml: """
            upstreams:
              up: { url: "http://127.0.0.1:\(upstream.port)", transport: nio }
            middleware:
              log: { type: access_log }
            routes:
              - { name: held, match: { path: /held }, upstream: up, max_in_flight: 1, middleware: [log] }
            """, environment: [:])
        let capture = LogCapture(message: "request")
        let gateway = try TestGateway(config, logger: capture.logger)
        let held = try gateway.connect()
        try await held.send("GET /held HTTP/1.1\r\nHost: x\r\n\r\n")
        try await Eventually.wait { gateway.server.inFlightRequests == 1 }
        let refused = try await gateway.request("GET", "/held", headers: [("X-Request-ID", "over-1")])
        #expect(refused.status == 503)
        release.open()
        #expect(try #require(try await held.readResponse()).status == 200)
        await gateway.stop()
        await upstream.shutdown()
        let line = try Self.line(capture, "over-1")
        #expect(line["route"]?.description == "held")
        #expect(line["upstream"] == nil, "refused before the upstream was asked: \(line)")
        #expect(line["error"]?.description == "overloaded")
        #expect(line["bytes_out"]?.description == String(refused.body.count))
    }

    @Test("requests refused as their head is read are logged and carry X-Request-ID: 413, 431, framing 400")
    func refusedAtTheHead() async throws {
        let config = try ConfigLoader.load(yaml: """
            listen: { max_body_bytes: 100, max_header_bytes: 2KiB }
            middleware:
              log: { type: access_log }
            defaults: { middleware: [log] }
            routes:
              - { name: ping, match: { path: /ping }, direct: { status: 200, body: "pong" } }
            """, environment: [:])
        let capture = LogCapture(message: "request")
        let gateway = try TestGateway(config, logger: capture.logger)
        let heads = [
            ("head-413", "POST /ping HTTP/1.1\r\nHost: x\r\nX-Request-ID: head-413\r\nContent-Length: 1000\r\n\r\n", 413),
            ("head-431", "GET /ping HTTP/1.1\r\nHost: x\r\nX-Request-ID: head-431\r\nX-Big: \(String(repeating: "b", count: 3000))\r\n\r\n", 431),
            ("head-400", "POST /ping HTTP/1.1\r\nHost: x\r\nX-Request-ID: head-400\r\nContent-Length: 3\r\n"
                + "Transfer-Encoding: chunked\r\n\r\n", 400),
        ]
        var bodies: [String: Int] = [:]
        for (id, head, status) in heads {
            let connection = try gateway.connect()
            try await connection.send(head)
            let response = try #require(try await connection.readResponse(), "\(id)")
            #expect(response.status == status, "\(id)")
            #expect(response.header("x-request-id") == id)
            #expect(response.bodyText.contains("\"request_id\":\"\(id)\""))
            bodies[id] = response.body.count
        }
        await gateway.stop()
        for (id, _, status) in heads {
            let line = try Self.line(capture, id)
            #expect(line["status"]?.description == String(status), "\(id)")
            #expect(line["route"]?.description == "", "\(id)")
            #expect(line["bytes_out"]?.description == bodies[id].map(String.init), "\(id)")
            #expect(line["bytes_in"]?.description == "0", "\(id)")
        }
    }
}
