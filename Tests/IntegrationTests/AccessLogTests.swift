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
