import Foundation

/// The WebSocket tests' independent peers, on Python's `websockets` package (PyPI; scripts/test
/// installs it into .build/test-python): an upstream (scripts/ws_upstream.py) recording what it
/// sees, and a client (scripts/ws_client.py) that runs one scenario and says `ok` or what failed.
public enum WebSocketLab {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// A Python that imports `websockets`: scripts/test's virtual environment, else the one on PATH.
    public static let python: String? = TestPython.interpreter(importing: "websockets.asyncio.server")

    static func script(_ name: String) -> String { root.appendingPathComponent("scripts/\(name)").path }

    /// The upstream, listening on 127.0.0.1; its events are in `events(of:)`.
    public static func upstream() async throws -> ExternalServer {
        guard let python else { throw ExternalServer.Failure(description: "Python's websockets is not installed") }
        return try await ScratchDirectory.make("portico") { directory in
            let events = directory.appendingPathComponent("events").path
            return try await ExternalServer.retryingPorts { port in
                try await ExternalServer(executable: python, arguments: [script("ws_upstream.py"), String(port), events],
                                         port: port, directory: directory)
            }
        }
    }

    /// The upstream's event lines so far.
    public static func events(of server: ExternalServer) -> [String] {
        let text = (try? String(contentsOf: server.directory.appendingPathComponent("events"), encoding: .utf8)) ?? ""
        return text.split(separator: "\n").map(String.init)
    }

    /// Waits (polling, up to `timeout`) until an upstream event satisfies `match`.
    public static func waitForEvent(of server: ExternalServer, timeout: Duration = .seconds(30),
                                    _ match: (String) -> Bool) async -> String? {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while ContinuousClock.now < deadline {
            if let line = events(of: server).first(where: match) { return line }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }

    /// Runs the client's `scenario` against `url` (`ws://127.0.0.1:PORT`); returns its exit
    /// status (nil: it did not finish in time) and output.
    public static func client(_ url: String, _ scenario: String, _ argument: String? = nil, _ more: [String] = [],
                              timeout: Duration = .seconds(120)) async throws -> (status: Int32?, output: String) {
        guard let python else { throw ExternalServer.Failure(description: "Python's websockets is not installed") }
        let directory = try ScratchDirectory.make("portico")
        defer { ScratchDirectory.remove(directory) }
        let output = directory.appendingPathComponent("out").path
        let process = try ChildProcess(executable: python,
                                       arguments: [script("ws_client.py"), url, scenario] + (argument.map { [$0] } ?? []) + more,
                                       standardOutput: .file(output), standardError: .file(output))
        let status = await process.waitForExit(timeout: timeout)
        if status == nil { await process.terminate() }
        return (status, (try? String(contentsOfFile: output, encoding: .utf8)) ?? "")
    }
}
