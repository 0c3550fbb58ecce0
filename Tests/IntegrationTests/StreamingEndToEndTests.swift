import Foundation
import Portico
import PorticoTesting
import Testing

/// Issue #21 end to end: the built `portico` binary (a child process, generated YAML, ports
/// chosen by the kernel) in front of `scripts/streamlab.py`, an independent Python upstream, on
/// both transports. The same checks pass through nginx with `proxy_buffering off`
/// (`StreamingHarnessTests`), which validates the harness itself.
///
/// On HTTP/2 (issue #45; `nio` only) the upstream Portico speaks to is that same nginx, on an h2c
/// listener, in front of streamlab.py: the script speaks HTTP/1.1 only, and nginx with
/// `proxy_buffering off` passes its pace, its closes and its resets on as HTTP/2 flow control,
/// `RST_STREAM`s and END_STREAM (the harness tests show it hides nothing of the streaming).
///
/// Not skipped when something is missing: a missing binary, python3 or script fails the tests.
/// Run: `swift build --build-tests && swift test --skip-build --filter StreamingEndToEndTests`
/// (`PORTICO_STREAM_TEST_BYTES=67108864` shrinks the 1 GiB transfers for a quick look;
/// `PORTICO_BINARY=/path/to/portico` runs another build, e.g. a release one).
@Suite("Streaming end to end through the portico binary (issue #21)", .serialized)
struct StreamingEndToEndTests {
    typealias Transport = UpstreamConfig.Transport

    /// A transport, and on `nio` the protocol to the upstream.
    struct Leg: Hashable, Sendable, CustomTestStringConvertible {
        var transport: Transport
        var httpProtocol: UpstreamProtocol = .http1

        /// urlsession speaks HTTP/1.1 only (`check` refuses protocol: http2 on it).
        static let all = [Leg(transport: .urlsession), Leg(transport: .nio), Leg(transport: .nio, httpProtocol: .http2)]

        var name: String { transport.rawValue + (httpProtocol == .http1 ? "" : " \(httpProtocol.rawValue)") }

        /// The big transfers' size. HTTP/2 in a debug build moves ~35 MiB/s on the loaded 2-core
        /// machine (1 GiB: 30 s a transfer, two minutes more for the suite); 256 MiB is still four
        /// times `memoryBound`, so a proxy holding the body would still fail.
        var bigTransfer: Int {
            httpProtocol == .http1 ? StreamingScenarios.bigTransfer : min(StreamingScenarios.bigTransfer, 256 * StreamingScenarios.mebibyte)
        }
        var testDescription: String { name }
    }

    /// What each transport is expected to do: one line per transport. Where one cannot (say,
    /// URLSession on Linux has no way to pause a download), name the check and the reason, e.g.
    /// `.urlsession: Expected(slowReader: .knownIssue("URLSession cannot pause a response"))`;
    /// that test still runs and its failures are recorded as a known issue (say so in the README's
    /// transport table too).
    static let expected: [Leg: Expected] = [
        Leg(transport: .nio): Expected(),
        Leg(transport: .nio, httpProtocol: .http2): Expected(),
        // FoundationNetworking on Linux can neither pause a download nor stream an upload
        // (measured: bench/RESULTS.md, README transport table): a streamed upload is read whole
        // up to 64 MiB and refused with 413 beyond (URLSessionStreamingTests checks the refusal).
        Leg(transport: .urlsession): Expected(
            download: .knownIssue("URLSession on Linux cannot pause a response: libcurl reads ahead of the client, up to max_response_bytes"),
            upload: .knownIssue("urlsession cannot stream uploads: over 64 MiB it answers 413 payload_too_large"),
            heldUpload: .knownIssue("urlsession cannot stream uploads: over 64 MiB it answers 413 payload_too_large"),
            slowReader: .knownIssue("URLSession on Linux cannot pause a response: a slow client makes Portico queue up to max_response_bytes"),
            // Reading ahead, libcurl may have the whole download (the upstream done, its
            // connection kept alive) before the client leaves: then there is no close to see.
            hangUpMidDownload: .knownIssue("URLSession reads a download ahead of the client: the upstream may finish before the client leaves")),
    ]

    struct Expected {
        var sse = StreamingExpectation.streams
        var download = StreamingExpectation.streams
        var upload = StreamingExpectation.streams
        var heldUpload = StreamingExpectation.streams
        var slowReader = StreamingExpectation.streams
        var hangUp = StreamingExpectation.streams
        var hangUpMidDownload = StreamingExpectation.streams
        var upstreamAbort = StreamingExpectation.streams
    }

    /// One upstream connection: every scenario sends one request at a time, and a connection a
    /// hang-up leaked would block the next request (`Path.expectUsable`). On HTTP/2 both threads'
    /// requests are streams on that one connection (`ProxyConformanceTests.capBelowThreads`), and
    /// the next request is a new stream on it, which must still serve.
    static func yaml(upstreamPort: Int, leg: Leg) -> String {
        let maxConnections = 1
        return """
        listen: { address: 127.0.0.1, port: 0, threads: 2, request_timeout: 300s, max_body_bytes: 2GiB }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        upstreams:
          lab: { url: "http://127.0.0.1:\(upstreamPort)", transport: \(leg.transport.rawValue), protocol: \(leg.httpProtocol.rawValue),
                 timeout: 300s, max_response_bytes: 2GiB, max_connections: \(maxConnections) }
        routes:
          - { name: lab, match: { path_prefix: / }, upstream: lab, timeout: 300s }
        """
    }

    /// The upstream and Portico in front of it (warmed up: one small request), for `body`.
    static func withPortico(_ leg: Leg, _ body: (StreamingScenarios.Path) async throws -> Void) async throws {
        try #require(ExternalServer.available("python3"), "python3 is needed (scripts/test installs it)")
        let lab = try await StreamLab.start()
        defer { lab.stop() }
        var upstreamPort = lab.port
        var nginx: ExternalServer?
        if leg.httpProtocol == .http2 {
            try #require(ExternalServer.available("nginx"), "nginx is needed (scripts/test installs nginx-light)")
            nginx = try await ExternalServer.nginx(serverBlock: StreamingHarnessTests.nginxBlock(upstreamPort: lab.port, buffering: false),
                                                   listenParameters: "http2")
            upstreamPort = nginx?.port ?? 0
        }
        defer { nginx?.stop() }
        let portico = try await ProxyProcess.portico(yaml: yaml(upstreamPort: upstreamPort, leg: leg),
                                                     name: "portico \(leg.name)\(nginx == nil ? "" : " → nginx h2c")")
        defer { portico.stop() }
        let path = StreamingScenarios.Path(lab: lab, proxy: portico)
        try await path.warmUp()
        try await body(path)
        #expect(portico.isRunning, path.note("portico exited"))
    }

    @Test("SSE: each event reaches the client before the next is released", arguments: Leg.all)
    func sse(leg: Leg) async throws {
        try await Self.expected[leg]!.sse.check {
            try await Self.withPortico(leg) { try await StreamingScenarios.sseEventByEvent($0) }
        }
    }

    @Test("1 GiB download (256 MiB on HTTP/2; Content-Length and chunked): SHA-256 matches, peak RSS grows < 64 MiB",
          arguments: Leg.all, ["length", "chunked"])
    func download(leg: Leg, framing: String) async throws {
        try await Self.expected[leg]!.download.check {
            try await Self.withPortico(leg) { try await StreamingScenarios.download($0, framing: framing, size: leg.bigTransfer) }
        }
    }

    @Test("1 GiB upload (256 MiB on HTTP/2; Content-Length and chunked): SHA-256 matches at the sink, peak RSS grows < 64 MiB",
          arguments: Leg.all, [false, true])
    func upload(leg: Leg, chunked: Bool) async throws {
        try await Self.expected[leg]!.upload.check {
            try await Self.withPortico(leg) { try await StreamingScenarios.upload($0, chunked: chunked, size: leg.bigTransfer) }
        }
    }

    @Test("an upload to a sink that reads nothing yet: the uploader gets < 32 MiB ahead; released, all arrives",
          arguments: Leg.all, [false, true])
    func heldUpload(leg: Leg, chunked: Bool) async throws {
        try await Self.expected[leg]!.heldUpload.check {
            try await Self.withPortico(leg) { try await StreamingScenarios.heldUpload($0, chunked: chunked) }
        }
    }

    @Test("a client that stops reading stops the upstream (< 32 MiB ahead); its reset closes the upstream",
          arguments: Leg.all)
    func slowReader(leg: Leg) async throws {
        try await Self.expected[leg]!.slowReader.check {
            try await Self.withPortico(leg) { try await StreamingScenarios.slowReader($0) }
        }
    }

    @Test("a client leaving mid-download: the upstream sees the close within 5 s, in-flight gauge back to baseline",
          arguments: Leg.all)
    func clientLeavesDownload(leg: Leg) async throws {
        try await Self.expected[leg]!.hangUpMidDownload.check {
            try await Self.withPortico(leg) { try await StreamingScenarios.clientLeavesDownload($0) }
        }
    }

    @Test("a client leaving an idle SSE stream: the upstream sees the close within 5 s, in-flight gauge back to baseline",
          arguments: Leg.all)
    func clientLeavesIdleSSE(leg: Leg) async throws {
        try await Self.expected[leg]!.hangUp.check {
            try await Self.withPortico(leg) { try await StreamingScenarios.clientLeavesIdleSSE($0) }
        }
    }

    @Test("the upstream failing mid-body: the client's connection closes short of the framing",
          arguments: Leg.all, ["length close", "chunked reset", "length reset", "chunked close"])
    func upstreamAbort(leg: Leg, failure: String) async throws {
        let framing = String(failure.split(separator: " ")[0]), how = String(failure.split(separator: " ")[1])
        try await Self.expected[leg]!.upstreamAbort.check {
            try await Self.withPortico(leg) {
                try await StreamingScenarios.upstreamAbort($0, framing: framing, how: how)
            }
        }
    }
}
