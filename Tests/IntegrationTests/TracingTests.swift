import Foundation
import Logging
import Portico
import PorticoDemo
import PorticoTesting
import Testing

/// Traces as a collector receives them: `portico demo`'s configuration with `tracing:` pointed at
/// `scripts/otlp_receiver.py` (decoding with the `opentelemetry-proto` package).
@Suite("Tracing")
struct TracingTests {
    static let callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let callerSpan = "00f067aa0ba902b7"
    static let traceparent = "00-\(callerTrace)-\(callerSpan)-01"

    /// The demo (IdP, upstream) and a gateway on its configuration, exporting to `endpoint` when given.
    struct Demo {
        let setup: DemoSetup
        let gateway: TestGateway
        let log = LogCapture(message: "request")

        init(tracingEndpoint: String?, adjust: (inout PorticoConfig) -> Void = { _ in }) throws {
            setup = try DemoSetup()
            var config = try setup.config(port: 0, adminPort: 0, tracingEndpoint: tracingEndpoint, environment: [:])
            config.tracing?.scheduleDelay = .milliseconds(50)
            // The demo's own limits (10 s a request, 5 s an upstream) are for people: the whole
            // suite in parallel on a small machine needs more.
            config.listen.requestTimeout = .seconds(60)
            for name in config.upstreams.keys { config.upstreams[name]?.timeout = .seconds(60) }
            adjust(&config)
            gateway = try TestGateway(config, logger: log.logger)
        }

        func stop() async {
            await gateway.stop()
            await setup.stop()
        }
    }

    /// A header the demo upstream's `/echo` saw.
    static func echoed(_ name: String, in response: RawHTTPResponse) throws -> [String] {
        struct Echo: Decodable {
            struct Field: Decodable { var name: String; var value: String }
            var headers: [Field]
        }
        return try JSONDecoder().decode(Echo.self, from: Data(response.body)).headers
            .filter { $0.name.lowercased() == name }.map(\.value)
    }

    @Test("a retried, authenticated request: the server span, each attempt and its wait, the token fetch, in the caller's trace")
    func retriedAuthenticated() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let demo = try Demo(tracingEndpoint: receiver.endpoint)
        let response = try await demo.gateway.request("GET", "/secure/flaky", headers: [("traceparent", Self.traceparent)])
        #expect(response.status == 200)
        let spans = try await receiver.waitForSpans("the server span, 3 attempts, 2 waits and a token fetch") { spans in
            spans.contains { $0.kind == "server" } && spans.filter { $0.kind == "client" }.count == 3
                && spans.filter { $0.name == "retry wait" }.count == 2 && spans.contains { $0.name == "token fetch" }
        }
        await demo.stop()

        #expect(spans.count == 7, "\(spans)")
        #expect(spans.allSatisfy { $0.traceID == Self.callerTrace }, "the caller's trace id is kept")
        #expect(spans.allSatisfy { $0.service == "portico-demo" })
        let server = try #require(spans.first { $0.kind == "server" })
        #expect(server.parentSpanID == Self.callerSpan)
        #expect(server.name == "GET /secure*")
        #expect(server.attributes["http.request.method"] == .string("GET"))
        #expect(server.attributes["http.response.status_code"] == .int(200))
        #expect(server.attributes["http.route"] == .string("/secure*"))
        #expect(server.attributes["url.path"] == .string("/secure/flaky"))
        #expect(server.attributes["portico.route"] == .string("reports"))
        #expect(server.attributes["portico.credential"] == .string("demo-idp"))
        #expect(server.attributes["portico.upstream.attempts"] == .int(3))
        #expect(server.status == "unset")

        let attempts = spans.filter { $0.kind == "client" }
            .sorted { ($0.attributes["http.request.resend_count"]?.description ?? "0") < ($1.attributes["http.request.resend_count"]?.description ?? "0") }
        #expect(attempts.allSatisfy { $0.parentSpanID == server.spanID && $0.name == "GET" })
        #expect(attempts.map { $0.attributes["http.response.status_code"] } == [.int(503), .int(503), .int(200)])
        #expect(attempts.map { $0.attributes["http.request.resend_count"] } == [nil, .int(1), .int(2)])
        #expect(attempts.map(\.status) == ["error", "error", "unset"])
        #expect(attempts.allSatisfy { $0.attributes["portico.credential"] == .string("demo-idp") })
        #expect(attempts.allSatisfy { $0.attributes["url.full"]?.description.hasSuffix("/secure/flaky\"") == true })

        let waits = spans.filter { $0.name == "retry wait" }
        #expect(waits.allSatisfy { $0.parentSpanID == server.spanID && $0.attributes["portico.retry.reason"] == .string("503") })
        let fetch = try #require(spans.first { $0.name == "token fetch" })
        #expect(fetch.parentSpanID == server.spanID)
        #expect(fetch.attributes["portico.credential"] == .string("demo-idp"))
        #expect(fetch.status == "unset")

        // No secret in any span: not the client secret, not the token.
        let everything = spans.flatMap { $0.attributes.values.map(\.description) }.joined(separator: " ")
        #expect(!everything.contains("demo-client-secret") && !everything.lowercased().contains("bearer"))

        // The access log line names the trace and Portico's server span.
        let line = try #require(demo.log.records.first { $0["route"] == "reports" })
        #expect(line["trace_id"] == .string(Self.callerTrace))
        #expect(line["span_id"] == .string(server.spanID))
    }

    @Test("the upstream receives Portico's client span as the parent, and the caller's tracestate")
    func propagatesUpstream() async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let demo = try Demo(tracingEndpoint: receiver.endpoint)
        let response = try await demo.gateway.request("GET", "/echo/x", headers: [("traceparent", Self.traceparent),
                                                                                   ("tracestate", "vendor=abc,other=1")])
        #expect(response.status == 200)
        let spans = try await receiver.waitForSpans("the server and client spans") { spans in
            spans.contains { $0.kind == "server" } && spans.contains { $0.kind == "client" }
        }
        await demo.stop()
        let client = try #require(spans.first { $0.kind == "client" })
        #expect(try Self.echoed("traceparent", in: response) == ["00-\(Self.callerTrace)-\(client.spanID)-01"])
        // The same list members in the same order (swift-otel writes them back with ", " between).
        let state = try Self.echoed("tracestate", in: response)
        #expect(state.flatMap { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } } == ["vendor=abc", "other=1"],
                "\(state)")
    }

    @Test("a missing or malformed traceparent starts a new trace", arguments: [
        nil, "00-zzzz", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "ff-\(callerTrace)-\(callerSpan)-01",
    ] as [String?])
    func newTrace(traceparent: String?) async throws {
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let demo = try Demo(tracingEndpoint: receiver.endpoint)
        let headers = traceparent.map { [("traceparent", $0), ("tracestate", "vendor=abc")] } ?? []
        let response = try await demo.gateway.request("GET", "/echo/x", headers: headers)
        #expect(response.status == 200)
        let spans = try await receiver.waitForSpans("the server and client spans") { spans in
            spans.contains { $0.kind == "server" } && spans.contains { $0.kind == "client" }
        }
        await demo.stop()
        let server = try #require(spans.first { $0.kind == "server" })
        let client = try #require(spans.first { $0.kind == "client" })
        #expect(server.parentSpanID.isEmpty)
        #expect(server.traceID.count == 32 && server.traceID != Self.callerTrace && server.traceID != String(repeating: "0", count: 32))
        #expect(client.traceID == server.traceID)
        #expect(try Self.echoed("traceparent", in: response) == ["00-\(server.traceID)-\(client.spanID)-01"])
        // The old trace's state does not follow into the new one.
        #expect(try Self.echoed("tracestate", in: response) == [])
    }

    @Test("tracing off: traceparent and tracestate go upstream unchanged; the access log has no trace ids")
    func off() async throws {
        let demo = try Demo(tracingEndpoint: nil)
        let response = try await demo.gateway.request("GET", "/echo/x", headers: [("traceparent", Self.traceparent),
                                                                                   ("tracestate", "vendor=abc")])
        #expect(response.status == 200)
        #expect(demo.gateway.server.gateway.current.tracing == nil)
        await demo.stop()
        #expect(try Self.echoed("traceparent", in: response) == [Self.traceparent])
        #expect(try Self.echoed("tracestate", in: response) == ["vendor=abc"])
        let line = try #require(demo.log.records.first { $0["route"] == "echo" })
        #expect(line["trace_id"] == nil && line["span_id"] == nil)
    }

    @Test("an absent or stalled collector never slows requests; spans past the queue are dropped and counted",
          arguments: ["absent", "stalled"])
    func unreachableCollector(collector: String) async throws {
        let refusing = try RefusingPort()
        let stalled = collector == "stalled" ? try await OTLPReceiver.start(stall: true) : nil
        defer { stalled?.stop() }
        let endpoint = stalled?.endpoint ?? "http://127.0.0.1:\(refusing.port)"
        let demo = try Demo(tracingEndpoint: endpoint) { config in
            config.tracing?.maxQueueSize = 4
            config.tracing?.scheduleDelay = .milliseconds(200)
            config.tracing?.timeout = .seconds(60)
        }
        #expect(try await demo.gateway.request("GET", "/fast/orders/1").status == 200)  // connections warmed up
        if let stalled {
            // An export is now stuck on the collector, for up to `timeout` (60 s).
            try await Eventually.wait(timeout: .seconds(30), "an export to reach the stalled collector") {
                stalled.requestsReceived > 0
            }
        }
        // A request that waited for the stuck export would take up to its 60 s timeout; the bound
        // is half of that, what the test controls, not a guess at how fast a loaded machine
        // answers (5 s failed once on a loaded machine with the collector absent).
        var slowest = Duration.zero
        for _ in 0..<30 {
            let start = ContinuousClock.now
            let response = try await demo.gateway.request("GET", "/fast/orders/1")
            slowest = max(slowest, start.duration(to: .now))
            #expect(response.status == 200)
        }
        #expect(slowest < .seconds(30), "slowest request: \(slowest)")
        // swift-otel reports drops at its next export round: let the stuck export fail now.
        stalled?.stop()
        let pipeline = try #require(demo.gateway.server.gateway.current.tracing)
        try await Eventually.wait(timeout: .seconds(30), "dropped spans to be counted") { pipeline.droppedSpans > 0 }
        await demo.stop()
    }

    @Test("a reload that changes tracing: applies it: spans go to the new collector, or nowhere once removed")
    func reload() async throws {
        let first = try await OTLPReceiver.start()
        defer { first.stop() }
        let second = try await OTLPReceiver.start()
        defer { second.stop() }
        let demo = try Demo(tracingEndpoint: first.endpoint)
        _ = try await demo.gateway.request("GET", "/orders", headers: [("traceparent", Self.traceparent)])
        try await first.waitForSpans("the first request's server span") { $0.contains { $0.kind == "server" } }

        var changed = demo.gateway.server.config
        changed.tracing?.endpoint = URL(string: second.endpoint)!
        try demo.gateway.server.reload(changed)
        _ = try await demo.gateway.request("GET", "/orders/2")
        let spans = try await second.waitForSpans("the second request's server span") { $0.contains { $0.kind == "server" } }
        #expect(spans.first { $0.kind == "server" }?.attributes["url.path"] == .string("/orders/2"))

        var removed = changed
        removed.tracing = nil
        try demo.gateway.server.reload(removed)
        let response = try await demo.gateway.request("GET", "/echo/x", headers: [("traceparent", Self.traceparent)])
        #expect(try Self.echoed("traceparent", in: response) == [Self.traceparent])
        await demo.stop()
        #expect(try first.spans().allSatisfy { $0.attributes["url.path"] != .string("/orders/2") })
    }
}

/// The "done": `portico demo` itself, exporting to the receiver.
@Suite("Tracing: portico demo --tracing-endpoint")
struct DemoTracingTests {
    @Test("a retried, authenticated request through `portico demo` shows the server span, each attempt and the token fetch")
    func demoCommand() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the portico product first")
        let receiver = try await OTLPReceiver.start()
        defer { receiver.stop() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-demo-trace-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let output = directory.appendingPathComponent("out").path
        let process = try ChildProcess(executable: CommandTests.binary,
                                       arguments: ["demo", "--port", "0", "--admin-port", "0", "--tracing-endpoint", receiver.endpoint],
                                       standardOutput: .file(output), standardError: .file(output))
        let log: @Sendable () -> String = { (try? String(contentsOfFile: output, encoding: .utf8)) ?? "" }
        do {
            try await Eventually.wait(timeout: .seconds(60), "the proxy listener") { log().contains("msg=listening") }
            let line = try #require(log().split(separator: "\n").first { $0.contains("msg=listening") })
            let port = try #require(line.split(separator: " ").first { $0.hasPrefix("port=") }.flatMap { Int($0.dropFirst(5)) })
            let connection = try RawHTTPConnection(port: port)
            try await connection.send("GET /secure/flaky HTTP/1.1\r\nHost: demo\r\ntraceparent: \(TracingTests.traceparent)\r\n\r\n")
            #expect(try await connection.readResponse()?.status == 200)
            let spans = try await receiver.waitForSpans("the demo's server span, 3 attempts and the token fetch") { spans in
                spans.contains { $0.kind == "server" } && spans.filter { $0.kind == "client" }.count == 3
                    && spans.contains { $0.name == "token fetch" }
            }
            let server = try #require(spans.first { $0.kind == "server" })
            #expect(spans.allSatisfy { $0.traceID == TracingTests.callerTrace && $0.service == "portico-demo" })
            #expect(spans.filter { $0.kind == "client" || $0.name == "token fetch" }.allSatisfy { $0.parentSpanID == server.spanID })
            process.signal(SIGTERM)
            #expect(await process.waitForExit(timeout: .seconds(60)) == 0, "\(log())")
        } catch {
            await process.terminate()
            throw error
        }
    }
}
