import Foundation
import Synchronization

/// `scripts/otlp_receiver.py`: an OpenTelemetry collector stand-in (OTLP/HTTP, decoded by the
/// `opentelemetry-proto` package from PyPI) that writes every span it receives as a JSON line.
public final class OTLPReceiver: Sendable {
    public let server: ExternalServer
    private let spansFile: String
    private let stopped = Atomic<Bool>(false)

    /// One span as the receiver decoded it. Ids are lower-case hex.
    public struct Span: Decodable, Sendable, CustomStringConvertible {
        public var traceID: String
        public var spanID: String
        public var parentSpanID: String
        public var name: String
        /// `server`, `client`, `internal`…
        public var kind: String
        /// `unset`, `ok`, `error`.
        public var status: String
        public var service: String?
        public var attributes: [String: Attribute]
        /// The export request's headers, lower-case names.
        public var headers: [String: String]

        enum CodingKeys: String, CodingKey {
            case traceID = "trace_id", spanID = "span_id", parentSpanID = "parent_span_id", name, kind, status,
                 service, attributes, headers
        }

        public var description: String {
            "\(kind) \"\(name)\" \(spanID) ← \(parentSpanID.isEmpty ? "-" : parentSpanID) [\(traceID)] \(attributes)"
        }
    }

    /// An attribute value: the receiver writes strings, integers, doubles and booleans.
    public enum Attribute: Decodable, Sendable, Equatable, CustomStringConvertible {
        case string(String), int(Int), double(Double), bool(Bool), other

        public init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let value = try? container.decode(Bool.self) { self = .bool(value) }
            else if let value = try? container.decode(Int.self) { self = .int(value) }
            else if let value = try? container.decode(Double.self) { self = .double(value) }
            else if let value = try? container.decode(String.self) { self = .string(value) }
            else { self = .other }
        }

        public var description: String {
            switch self {
            case .string(let value): "\"\(value)\""
            case .int(let value): String(value)
            case .double(let value): String(value)
            case .bool(let value): String(value)
            case .other: "?"
            }
        }
    }

    /// Starts the receiver on a free loopback port. `stall`: it accepts requests and never answers.
    public static func start(stall: Bool = false) async throws -> OTLPReceiver {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let script = root.appendingPathComponent("scripts/otlp_receiver.py").path
        // scripts/test's virtual environment has opentelemetry-proto; else the python3 on PATH.
        let venv = root.appendingPathComponent(".build/test-python/bin/python3").path
        let python = FileManager.default.isExecutableFile(atPath: venv) ? venv : ChildProcess.locate("python3") ?? "/usr/bin/python3"
        return try await ScratchDirectory.make("portico") { directory in
            let spansFile = directory.appendingPathComponent("spans.jsonl").path
            let server = try await ExternalServer.retryingPorts { port in
                try await ExternalServer(executable: python, arguments: [script, String(port), spansFile] + (stall ? ["--stall"] : []),
                                         port: port, directory: directory)
            }
            return OTLPReceiver(server: server, spansFile: spansFile)
        }
    }

    private init(server: ExternalServer, spansFile: String) {
        self.server = server
        self.spansFile = spansFile
    }

    /// The base URL to configure as `tracing.endpoint` (`/v1/traces` is added).
    public var endpoint: String { "http://127.0.0.1:\(server.port)" }

    /// Every span received so far.
    public func spans() throws -> [Span] {
        let text = (try? String(contentsOfFile: spansFile, encoding: .utf8)) ?? ""
        return try text.split(separator: "\n").map { try JSONDecoder().decode(Span.self, from: Data($0.utf8)) }
    }

    /// Export requests received so far (counted as they arrive, answered or not).
    public var requestsReceived: Int {
        ((try? String(contentsOfFile: spansFile + ".requests", encoding: .utf8)) ?? "").split(separator: "\n").count
    }

    /// Polls until `done` holds for the spans received (exports come in batches, on their schedule).
    @discardableResult
    public func waitForSpans(timeout: Duration = .seconds(30), _ what: String,
                             until done: @Sendable ([Span]) -> Bool) async throws -> [Span] {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while true {
            let received = try spans()
            if done(received) { return received }
            guard ContinuousClock.now < deadline else {
                throw Eventually.TimedOut(description: "timed out waiting for \(what); received:\n"
                                          + received.map(\.description).joined(separator: "\n"))
            }
            try await Task.sleep(for: .milliseconds(20))
        }
    }

    /// Stops the receiver (idempotent).
    public func stop() {
        guard !stopped.exchange(true, ordering: .relaxed) else { return }
        server.stop()
    }
}
