import Foundation
import PorticoTesting
import Testing

/// The streaming harness checked without Portico: every scenario of `StreamingEndToEndTests`
/// passes directly against the upstream (`scripts/streamlab.py`) and through nginx with
/// `proxy_buffering off` / `proxy_request_buffering off`; and through nginx with buffering on
/// (the negative control) the checks that should catch a buffering proxy do catch it.
/// Fails (is not skipped) when nginx or python3 is missing.
@Suite("Streaming harness: direct and through nginx", .serialized)
struct StreamingHarnessTests {
    enum Via: String, CaseIterable, Sendable {
        case direct
        case nginx = "nginx proxy_buffering off"
    }

    static func nginxBlock(upstreamPort: Int, buffering: Bool) -> String {
        """
        location / {
          proxy_pass http://127.0.0.1:\(upstreamPort);
          proxy_http_version 1.1; proxy_set_header Connection "";
          proxy_buffering \(buffering ? "on" : "off"); proxy_request_buffering \(buffering ? "on" : "off");
          client_max_body_size 0; proxy_read_timeout 300s; proxy_send_timeout 300s;
        }
        """
    }

    static func with(_ via: Via, buffering: Bool = false, _ body: (StreamingScenarios.Path) async throws -> Void) async throws {
        try #require(ExternalServer.available("python3"), "python3 is needed (scripts/test installs it)")
        let lab = try await StreamLab.start()
        defer { lab.stop() }
        var proxy: ProxyProcess?
        if via == .nginx {
            try #require(ExternalServer.available("nginx"), "nginx is needed (scripts/test installs nginx-light)")
            proxy = try await ProxyProcess.nginx(serverBlock: nginxBlock(upstreamPort: lab.port, buffering: buffering),
                                                 name: buffering ? "nginx proxy_buffering on" : via.rawValue)
        }
        defer { proxy?.stop() }
        let path = StreamingScenarios.Path(lab: lab, proxy: proxy)
        try await path.warmUp()
        try await body(path)
    }

    @Test("the pattern's digest is stable (a fixed seed: bench and tests agree)")
    func digestIsStable() async throws {
        #expect(try await StreamLab.digest(1 << 30) == "597671a6560984bf023c9aee4f1a34106af2617d9f9a84bdbffcc0a8c4801fd8")
    }

    @Test("SSE event by event", arguments: Via.allCases)
    func sse(via: Via) async throws {
        try await Self.with(via) { try await StreamingScenarios.sseEventByEvent($0) }
    }

    @Test("1 GiB download", arguments: Via.allCases, ["length", "chunked"])
    func download(via: Via, framing: String) async throws {
        try await Self.with(via) { try await StreamingScenarios.download($0, framing: framing) }
    }

    @Test("1 GiB upload", arguments: Via.allCases, [false, true])
    func upload(via: Via, chunked: Bool) async throws {
        try await Self.with(via) { try await StreamingScenarios.upload($0, chunked: chunked) }
    }

    @Test("upload to a sink that holds", arguments: Via.allCases, [false, true])
    func heldUpload(via: Via, chunked: Bool) async throws {
        try await Self.with(via) { try await StreamingScenarios.heldUpload($0, chunked: chunked) }
    }

    @Test("slow reader", arguments: Via.allCases)
    func slowReader(via: Via) async throws {
        try await Self.with(via) { try await StreamingScenarios.slowReader($0) }
    }

    @Test("client leaves mid-download", arguments: Via.allCases)
    func clientLeavesDownload(via: Via) async throws {
        try await Self.with(via) { try await StreamingScenarios.clientLeavesDownload($0) }
    }

    @Test("client leaves an idle SSE stream", arguments: Via.allCases)
    func clientLeavesIdleSSE(via: Via) async throws {
        try await Self.with(via) { try await StreamingScenarios.clientLeavesIdleSSE($0) }
    }

    @Test("upstream fails mid-body", arguments: Via.allCases, ["length close", "chunked reset", "length reset", "chunked close"])
    func upstreamAbort(via: Via, failure: String) async throws {
        let parts = failure.split(separator: " ").map(String.init)
        try await Self.with(via) { try await StreamingScenarios.upstreamAbort($0, framing: parts[0], how: parts[1]) }
    }

    // MARK: Negative controls: the checks catch a proxy that buffers

    @Test("negative control: through nginx with proxy_buffering on, the upstream runs far ahead of a client that stopped reading")
    func bufferingProxyFailsBackpressure() async throws {
        try await Self.with(.nginx, buffering: true) { path in
            let id = StreamingScenarios.transferID("slow")
            let client = try StreamingClient(port: path.port, receiveBuffer: 64 * 1024, timeout: .seconds(30))
            defer { client.close() }
            try await client.get("/download?bytes=\(1 << 30)&framing=length&id=\(id)&sndbuf=131072")
            #expect(try await client.readHead().status == 200)
            try await client.readBody(discarding: 4 << 20)
            let written = try await StreamingScenarios.settled { try await path.lab.stats(id).written ?? 0 }
            #expect(written - client.bodyBytes > StreamingScenarios.backpressureBound,
                    "nginx spools to its temp file: the check of slowReader must see the upstream run ahead (wrote \(written))")
        }
    }

    @Test("negative control: through nginx with proxy_request_buffering on, an uploader runs far ahead of a sink that holds")
    func bufferingProxyFailsHeldUpload() async throws {
        try await Self.with(.nginx, buffering: true) { path in
            let id = StreamingScenarios.transferID("held")
            let progress = FileManager.default.temporaryDirectory.appendingPathComponent("portico-\(id).progress").path
            defer { try? FileManager.default.removeItem(atPath: progress) }
            let upload = Task {
                try await StreamLab.upload(path.url("/upload?id=\(id)&hold=1"), count: 256 << 20, chunked: false, progress: progress)
            }
            let sent = try await StreamingScenarios.settled {
                (try? String(contentsOfFile: progress, encoding: .utf8)).flatMap { Int($0) } ?? 0
            }
            #expect(sent > StreamingScenarios.backpressureBound,
                    "nginx takes the whole body into its temp file: heldUpload's check must see the uploader run ahead (sent \(sent))")
            try await path.lab.release(id)
            #expect(try await upload.value.sink?.bytes == 256 << 20)
        }
    }

    @Test("negative control: a proxy that answers a short upstream body with a whole 502 fails upstreamAbort's check")
    func wholeErrorIsNotShort() async throws {
        // nginx's `return 502` stands in for a gateway that buffers, sees the short body, and
        // answers with a complete error response.
        let nginx = try await ProxyProcess.nginx(serverBlock: "location / { return 502 'bad gateway'; }")
        defer { nginx.stop() }
        let client = try StreamingClient(port: nginx.port, timeout: .seconds(10))
        try await client.get("/abort")
        #expect(try await client.readHead().status == 502)
        #expect(try await client.readBodyToEnd() == .complete)
    }
}
