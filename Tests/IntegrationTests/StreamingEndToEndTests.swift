import Foundation
import Portico
import PorticoTesting
import Testing

/// Issue #21 end to end: the built `portico` binary (a child process, generated YAML, ports
/// chosen by the kernel) in front of `scripts/streamlab.py`, an independent Python upstream, on
/// both transports. The same checks pass through nginx with `proxy_buffering off`
/// (`StreamingHarnessTests`), which validates the harness itself.
///
/// Not skipped when something is missing: a missing binary, python3 or script fails the tests.
/// Run: `swift build --build-tests && swift test --skip-build --filter StreamingEndToEndTests`
/// (`PORTICO_STREAM_TEST_BYTES=67108864` shrinks the 1 GiB transfers for a quick look;
/// `PORTICO_BINARY=/path/to/portico` runs another build, e.g. a release one).
@Suite("Streaming end to end through the portico binary (issue #21)", .serialized)
struct StreamingEndToEndTests {
    typealias Transport = UpstreamConfig.Transport

    /// What each transport is expected to do: one line per transport. Where one cannot (say,
    /// URLSession on Linux has no way to pause a download), name the check and the reason, e.g.
    /// `.urlsession: Expected(slowReader: .knownIssue("URLSession cannot pause a response"))`;
    /// that test still runs and its failures are recorded as a known issue (say so in the README's
    /// transport table too).
    static let expected: [Transport: Expected] = [
        .nio: Expected(),
        // FoundationNetworking on Linux can neither pause a download nor stream an upload
        // (measured: bench/RESULTS.md, README transport table): a streamed upload is read whole
        // up to 64 MiB and refused with 413 beyond (URLSessionStreamingTests checks the refusal).
        .urlsession: Expected(
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
    /// hang-up leaked would block the next request (`Path.expectUsable`).
    static func yaml(upstreamPort: Int, transport: Transport) -> String {
        """
        listen: { address: 127.0.0.1, port: 0, threads: 2, request_timeout: 300s, max_body_bytes: 2GiB }
        admin: { address: 127.0.0.1, port: 0 }
        logging: { level: info, format: logfmt }
        upstreams:
          lab: { url: "http://127.0.0.1:\(upstreamPort)", transport: \(transport.rawValue), timeout: 300s, max_response_bytes: 2GiB,
                 max_connections: 1 }
        routes:
          - { name: lab, match: { path_prefix: / }, upstream: lab, timeout: 300s }
        """
    }

    /// The upstream and Portico in front of it (warmed up: one small request), for `body`.
    static func withPortico(_ transport: Transport, _ body: (StreamingScenarios.Path) async throws -> Void) async throws {
        try #require(ExternalServer.available("python3"), "python3 is needed (scripts/test installs it)")
        let lab = try await StreamLab.start()
        defer { lab.stop() }
        let portico = try await ProxyProcess.portico(yaml: yaml(upstreamPort: lab.port, transport: transport),
                                                     name: "portico \(transport.rawValue)")
        defer { portico.stop() }
        let path = StreamingScenarios.Path(lab: lab, proxy: portico)
        try await path.warmUp()
        try await body(path)
        #expect(portico.isRunning, path.note("portico exited"))
    }

    @Test("SSE: each event reaches the client before the next is released", arguments: Transport.allCases)
    func sse(transport: Transport) async throws {
        try await Self.expected[transport]!.sse.check {
            try await Self.withPortico(transport) { try await StreamingScenarios.sseEventByEvent($0) }
        }
    }

    @Test("1 GiB download (Content-Length and chunked): SHA-256 matches, peak RSS grows < 64 MiB",
          arguments: Transport.allCases, ["length", "chunked"])
    func download(transport: Transport, framing: String) async throws {
        try await Self.expected[transport]!.download.check {
            try await Self.withPortico(transport) { try await StreamingScenarios.download($0, framing: framing) }
        }
    }

    @Test("1 GiB upload (Content-Length and chunked): SHA-256 matches at the sink, peak RSS grows < 64 MiB",
          arguments: Transport.allCases, [false, true])
    func upload(transport: Transport, chunked: Bool) async throws {
        try await Self.expected[transport]!.upload.check {
            try await Self.withPortico(transport) { try await StreamingScenarios.upload($0, chunked: chunked) }
        }
    }

    @Test("an upload to a sink that reads nothing yet: the uploader gets < 32 MiB ahead; released, all arrives",
          arguments: Transport.allCases, [false, true])
    func heldUpload(transport: Transport, chunked: Bool) async throws {
        try await Self.expected[transport]!.heldUpload.check {
            try await Self.withPortico(transport) { try await StreamingScenarios.heldUpload($0, chunked: chunked) }
        }
    }

    @Test("a client that stops reading stops the upstream (< 32 MiB ahead); its reset closes the upstream",
          arguments: Transport.allCases)
    func slowReader(transport: Transport) async throws {
        try await Self.expected[transport]!.slowReader.check {
            try await Self.withPortico(transport) { try await StreamingScenarios.slowReader($0) }
        }
    }

    @Test("a client leaving mid-download: the upstream sees the close within 5 s, in-flight gauge back to baseline",
          arguments: Transport.allCases)
    func clientLeavesDownload(transport: Transport) async throws {
        try await Self.expected[transport]!.hangUpMidDownload.check {
            try await Self.withPortico(transport) { try await StreamingScenarios.clientLeavesDownload($0) }
        }
    }

    @Test("a client leaving an idle SSE stream: the upstream sees the close within 5 s, in-flight gauge back to baseline",
          arguments: Transport.allCases)
    func clientLeavesIdleSSE(transport: Transport) async throws {
        try await Self.expected[transport]!.hangUp.check {
            try await Self.withPortico(transport) { try await StreamingScenarios.clientLeavesIdleSSE($0) }
        }
    }

    @Test("the upstream failing mid-body: the client's connection closes short of the framing",
          arguments: Transport.allCases, ["length close", "chunked reset", "length reset", "chunked close"])
    func upstreamAbort(transport: Transport, failure: String) async throws {
        let framing = String(failure.split(separator: " ")[0]), how = String(failure.split(separator: " ")[1])
        try await Self.expected[transport]!.upstreamAbort.check {
            try await Self.withPortico(transport) {
                try await StreamingScenarios.upstreamAbort($0, framing: framing, how: how)
            }
        }
    }
}
