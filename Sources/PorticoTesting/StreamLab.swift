import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `scripts/streamlab.py` run as an independent upstream (Python's stdlib, not Portico's code):
/// gated SSE, generated downloads whose SHA-256 is known, a hashing upload sink, mid-body aborts,
/// and per-transfer counters the tests read while a transfer runs. See the script's docstring
/// for the endpoints. Also runs the script's clients (`get`, `put`), which hash what they move.
public final class StreamLab: Sendable {
    public let port: Int
    private let process: ChildProcess
    private let directory: URL

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// The script in the source tree (located from this file, as tests run from the build folder).
    public static var script: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/streamlab.py").path
    }

    public static var python: String { ChildProcess.locate("python3") ?? "/usr/bin/python3" }

    /// Starts the upstream on a port the kernel chooses (written to a file by the script: no race).
    public static func start() async throws -> StreamLab {
        guard FileManager.default.fileExists(atPath: script) else { throw Failure(description: "missing \(script)") }
        return try await ScratchDirectory.make("portico-streamlab") { directory in
            let portFile = directory.appendingPathComponent("port").path
            let log = directory.appendingPathComponent("log").path
            let process = try ChildProcess(executable: python, arguments: [script, "serve", "--port-file", portFile],
                                           standardOutput: .file(log), standardError: .file(log))
            let deadline = ContinuousClock.now.advanced(by: .seconds(30))
            while ContinuousClock.now < deadline, process.isRunning {
                if let text = try? String(contentsOfFile: portFile, encoding: .utf8), let port = Int(text) {
                    return StreamLab(port: port, process: process, directory: directory)
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            await process.terminate()
            let output = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            throw Failure(description: "streamlab.py did not start: \(output)")
        }
    }

    private init(port: Int, process: ChildProcess, directory: URL) {
        self.port = port
        self.process = process
        self.directory = directory
    }

    /// SIGTERM now; reaped (and its folder removed) in the background. Usable from `defer`.
    public func stop() {
        process.stopInBackground(removing: directory)
    }

    /// A transfer's counters, as the upstream saw them.
    public struct Stats: Decodable, Sendable, CustomStringConvertible {
        /// Download: bytes the kernel accepted from the upstream so far.
        public var written: Int?
        /// The peer (the proxy, or the client when direct) went away before the end.
        public var closed: Bool?
        public var done: Bool?
        /// SSE: events sent so far.
        public var sent: Int?
        /// Upload: bytes read so far (and, once done, their SHA-256).
        public var received: Int?
        public var sha256: String?
        public var released: Int
        public var error: String?

        public var description: String {
            "written=\(written.map(String.init) ?? "-") sent=\(sent.map(String.init) ?? "-") received=\(received.map(String.init) ?? "-") "
                + "closed=\(closed.map(String.init) ?? "-") done=\(done.map(String.init) ?? "-") error=\(error ?? "-")"
        }
    }

    public func stats(_ id: String) async throws -> Stats {
        try await control("/control/stats?id=\(id)")
    }

    /// Opens transfer `id`'s gate `count` more times (SSE: lets the next event go; upload hold: starts reading).
    @discardableResult
    public func release(_ id: String, count: Int = 1) async throws -> Stats {
        try await control("/control/release?id=\(id)&count=\(count)")
    }

    private func control(_ target: String) async throws -> Stats {
        let connection = try RawHTTPConnection(port: port, timeout: .seconds(10))
        try await connection.send("GET \(target) HTTP/1.1\r\nHost: streamlab\r\nConnection: close\r\n\r\n")
        guard let response = try await connection.readResponse(), response.status == 200 else {
            throw Failure(description: "streamlab control \(target) failed")
        }
        return try JSONDecoder().decode(Stats.self, from: Data(response.body))
    }

    // MARK: The script's clients and the expected digests

    private static let digests = DigestCache()

    /// SHA-256 (hex) of the first `count` bytes of the script's pattern (computed once per size).
    public static func digest(_ count: Int) async throws -> String {
        if let known = await digests.value(count) { return known }
        let output = try await run([script, "digest", String(count)], timeout: .seconds(120))
        let value = output.trimmingCharacters(in: .whitespacesAndNewlines)
        guard value.count == 64 else { throw Failure(description: "digest: \(output)") }
        await digests.store(count, value)
        return value
    }

    /// What `streamlab.py get` saw of a download.
    public struct Download: Decodable, Sendable {
        public var status: Int
        public var bytes: Int
        public var sha256: String
        /// The framing ended properly (Content-Length reached, terminating chunk, or close-delimited).
        public var complete: Bool
        public var seconds: Double
    }

    /// Downloads `url` with the script's client (hashing as it reads).
    public static func download(_ url: String, timeout: Duration = .seconds(300)) async throws -> Download {
        let output = try await run([script, "get", url], timeout: timeout)
        return try JSONDecoder().decode(Download.self, from: Data(output.utf8))
    }

    /// What `streamlab.py put` sent, and the answer it got.
    public struct Upload: Decodable, Sendable {
        public var status: Int
        public var sent: Int
        public var sentSHA256: String
        /// The response body (the sink answers `{"bytes": N, "sha256": "..."}`).
        public var answer: String
        public var seconds: Double
        public var error: String?

        enum CodingKeys: String, CodingKey {
            case status, sent, sentSHA256 = "sent_sha256", answer, seconds, error
        }

        public struct SinkAnswer: Decodable, Sendable {
            public var bytes: Int
            public var sha256: String
        }

        public var sink: SinkAnswer? { try? JSONDecoder().decode(SinkAnswer.self, from: Data(answer.utf8)) }
    }

    /// Uploads `count` pattern bytes to `url` (`Content-Length`, or chunked). With `progress`, the
    /// client keeps the count of bytes sent so far (every MiB) in that file.
    public static func upload(_ url: String, count: Int, chunked: Bool, progress: String? = nil,
                              timeout: Duration = .seconds(300)) async throws -> Upload {
        let output = try await run([script, "put", url, "--bytes", String(count)] + (chunked ? ["--chunked"] : [])
                                   + (progress.map { ["--progress", $0] } ?? []), timeout: timeout)
        return try JSONDecoder().decode(Upload.self, from: Data(output.utf8))
    }

    /// Runs the script with `arguments`, returns its standard output (throws on failure or timeout).
    static func run(_ arguments: [String], timeout: Duration) async throws -> String {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("portico-streamlab-\(UUID().uuidString).out").path
        let errors = file + ".err"
        defer {
            try? FileManager.default.removeItem(atPath: file)
            try? FileManager.default.removeItem(atPath: errors)
        }
        let process = try ChildProcess(executable: python, arguments: arguments, standardOutput: .file(file), standardError: .file(errors))
        let status = await process.waitForExit(timeout: timeout)
        if status == nil { await process.terminate() }
        let output = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
        guard status == 0 else {
            let stderr = (try? String(contentsOfFile: errors, encoding: .utf8)) ?? ""
            throw Failure(description: "streamlab.py \(arguments.dropFirst().joined(separator: " ")): "
                + "\(status.map { "exit \($0)" } ?? "timed out"): \(output)\(stderr)")
        }
        return output
    }
}

private actor DigestCache {
    var values: [Int: String] = [:]
    func value(_ count: Int) -> String? { values[count] }
    func store(_ count: Int, _ value: String) { values[count] = value }
}
