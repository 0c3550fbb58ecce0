import Foundation
import Portico
import PorticoTesting
import Testing

/// Two upstreams on 127.0.0.1 and 127.0.0.2 where the first request of all gets no answer until
/// its client closes the connection, and every later one an answer at once: the tests tell
/// hedging apart by outcome (the fast answer, or the route's timeout), never by timing.
struct HangingPair {
    var upstreams: [TestUpstream]

    static func start() async throws -> HangingPair {
        let seen = Shared(0)
        var upstreams: [TestUpstream] = []
        for host in ["127.0.0.1", "127.0.0.2"] {
            let upstream = TestUpstream(host: host)
            upstream.route("/api/item") { _ in
                seen.update { $0 += 1; return $0 } == 1 ? .untilClientCloses : .text("fast\n")
            }
            try await upstream.start()
            upstreams.append(upstream)
        }
        return HangingPair(upstreams: upstreams)
    }

    var urls: [URL] { upstreams.map(\.baseURL) }
    var hits: [Int] { upstreams.map { $0.hits("/api/item") } }
    var abandoned: Int { upstreams.map(\.abandoned).reduce(0, +) }

    func stop() async {
        for upstream in upstreams { await upstream.shutdown() }
    }
}

@Suite("Hedged requests through the real gateway", .timeLimit(.minutes(2)))
struct HedgeTests {
    static func hedged(_ configure: (inout RetryConfig) -> Void = { _ in }) -> RetryConfig {
        quickRetry { retry in
            retry.hedge = HedgeConfig(after: .fixed(.milliseconds(100)), min: .milliseconds(20), maxExtra: 1)
            configure(&retry)
        }
    }

    static func config(_ pair: HangingPair, transport: UpstreamConfig.Transport, retry: RetryConfig,
                       timeout: Duration = .seconds(20)) -> PorticoConfig {
        var config = resilienceConfig(pair.urls, transport: transport, retry: retry)
        config.routes[0].timeout = timeout
        return config
    }

    @Test("a hanging attempt is hedged to the other endpoint: the caller gets the fast answer, the hung exchange is closed",
          arguments: UpstreamConfig.Transport.allCases)
    func hedgeAnswers(transport: UpstreamConfig.Transport) async throws {
        let pair = try await HangingPair.start()
        let log = AccessLogCapture()
        let gateway = try TestGateway(Self.config(pair, transport: transport, retry: Self.hedged()), logger: log.logger)
        let response = try await gateway.request("GET", "/api/item")
        #expect(response.status == 200)
        #expect(response.bodyText == "fast\n")
        // One attempt on each endpoint: the hedge avoided the one it raced.
        #expect(pair.hits.sorted() == [1, 1])
        // The upstream sees the losing exchange's connection closed.
        try await Eventually.wait("the hung exchange is closed") { pair.abandoned == 1 }
        try await Eventually.wait("the access log line") { !log.records.isEmpty }
        let line = try #require(log.records.first)
        #expect(line["hedges"]?.description == "1")
        // The hedge, unless the first attempt was so slow to arrive that the hedge got the hang.
        #expect(["1", "2"].contains(line["hedge_winner"]?.description))
        #expect(line["hedges_cancelled"]?.description == "1")
        #expect(line["attempts"]?.description == "2" && line["retries"]?.description == "0")
        // The connection that answered is reused; the gateway keeps serving.
        let again = try await gateway.request("GET", "/api/item")
        #expect(again.status == 200)
        await gateway.stop()
        await pair.stop()
    }

    @Test("without hedging the caller waits for the hanging attempt until the route's timeout",
          arguments: UpstreamConfig.Transport.allCases)
    func withoutHedgeWaits(transport: UpstreamConfig.Transport) async throws {
        let pair = try await HangingPair.start()
        let gateway = try TestGateway(Self.config(pair, transport: transport, retry: quickRetry(), timeout: .milliseconds(1500)))
        let response = try await gateway.request("GET", "/api/item")
        #expect(response.status == 504)
        #expect(pair.hits.reduce(0, +) == 1)
        await gateway.stop()
        await pair.stop()
    }

    @Test("POST is never hedged")
    func postNotHedged() async throws {
        let pair = try await HangingPair.start()
        let gateway = try TestGateway(Self.config(pair, transport: .nio, retry: Self.hedged(), timeout: .milliseconds(1500)))
        let response = try await gateway.request("POST", "/api/item", body: Array("order".utf8))
        #expect(response.status == 504)
        #expect(pair.hits.reduce(0, +) == 1)
        await gateway.stop()
        await pair.stop()
    }

    @Test("with the retry budget spent no hedge goes out")
    func budgetSpent() async throws {
        let pair = try await HangingPair.start()
        let log = AccessLogCapture()
        let retry = Self.hedged { $0.budget = 0; $0.minRetriesPerSecond = 0 }
        let gateway = try TestGateway(Self.config(pair, transport: .nio, retry: retry, timeout: .milliseconds(1500)), logger: log.logger)
        let response = try await gateway.request("GET", "/api/item")
        #expect(response.status == 504)
        #expect(pair.hits.reduce(0, +) == 1)
        try await Eventually.wait("the access log line") { !log.records.isEmpty }
        #expect(log.records.first?["hedge_stopped"]?.description == "budget")
        await gateway.stop()
        await pair.stop()
    }

    @Test("a streamed request body is never hedged")
    func streamedNotHedged() async throws {
        let pair = try await HangingPair.start()
        let gateway = try TestGateway(Self.config(pair, transport: .nio, retry: Self.hedged(), timeout: .milliseconds(1500)))
        let connection = try gateway.connect()
        try await connection.send("PUT /api/item HTTP/1.1\r\nHost: gateway.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        let response = try #require(try await connection.readResponse())
        #expect(response.status == 504)
        #expect(pair.hits.reduce(0, +) == 1)
        await gateway.stop()
        await pair.stop()
    }

    @Test("the trace shows the hedge: a hedge span with its attempt below, and the counts on the server span")
    func traced() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let pair = try await HangingPair.start()
        var config = Self.config(pair, transport: .nio, retry: Self.hedged())
        var tracing = TracingConfig(endpoint: URL(string: receiver.endpoint)!)
        tracing.scheduleDelay = .milliseconds(50)
        config.tracing = tracing
        let gateway = try TestGateway(config)
        let response = try await gateway.request("GET", "/api/item")
        #expect(response.status == 200)
        let spans = try await receiver.waitForSpans("the server span, two attempts and a hedge") { spans in
            spans.contains { $0.kind == "server" } && spans.filter { $0.kind == "client" }.count == 2
                && spans.contains { $0.name == "hedge" }
        }
        await gateway.stop()
        await pair.stop()
        let server = try #require(spans.first { $0.kind == "server" })
        #expect(server.attributes["portico.hedge.sent"] == .int(1))
        #expect(server.attributes["portico.hedge.cancelled"] == .int(1))
        let hedge = try #require(spans.first { $0.name == "hedge" })
        #expect(hedge.parentSpanID == server.spanID)
        #expect(hedge.attributes["portico.hedge.number"] == .int(1))
        #expect(hedge.attributes["portico.hedge.delay_ms"] == .int(100))
        let attempts = spans.filter { $0.kind == "client" }
        #expect(attempts.contains { $0.parentSpanID == hedge.spanID })
        #expect(attempts.contains { $0.parentSpanID == server.spanID })
    }
}
