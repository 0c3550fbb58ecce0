import Foundation

/// The HTTP/2 tests' own upstream (scripts/h2_upstream.py, on Python's `h2`: PyPI, installed by
/// scripts/test, or Debian's python3-h2): honest paths and hostile ones (floods, malformed
/// frames, a stalled window, trailers), recording what it sees as JSON lines (`events(of:)`).
public enum HTTP2Lab {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// A Python that imports `h2`: scripts/test's virtual environment, else the one on PATH.
    public static let python: String? = TestPython.interpreter(importing: "h2")

    /// One line of the upstream's record (fields as scripts/h2_upstream.py names them).
    public struct Event: Decodable, Sendable, CustomStringConvertible {
        public var event: String
        public var conn: Int?
        public var stream: Int?
        public var path: String?
        public var afterGoaway: Bool?
        public var code: Int?
        public var last: Int?
        public var bytes: Int?
        public var kind: String?
        public var frames: Int?
        public var ending: String?
        public var goaway: Int?
        public var error: String?

        enum CodingKeys: String, CodingKey {
            case event, conn, stream, path, code, last, bytes, kind, frames, ending, goaway, error
            case afterGoaway = "after_goaway"
        }

        public var description: String {
            var parts = [event]
            if let conn { parts.append("conn=\(conn)") }
            if let stream { parts.append("stream=\(stream)") }
            if let path { parts.append("path=\(path)") }
            if let afterGoaway { parts.append("after_goaway=\(afterGoaway)") }
            if let code { parts.append("code=\(code)") }
            if let bytes { parts.append("bytes=\(bytes)") }
            if let kind { parts.append("kind=\(kind)") }
            if let frames { parts.append("frames=\(frames)") }
            if let ending { parts.append("ending=\(ending)") }
            if let goaway { parts.append("goaway=\(goaway)") }
            if let error { parts.append("error=\(error)") }
            return parts.joined(separator: " ")
        }
    }

    /// The upstream, listening on 127.0.0.1 (cleartext HTTP/2 by prior knowledge).
    public static func upstream() async throws -> ExternalServer {
        guard let python else { throw ExternalServer.Failure(description: "Python's h2 is not installed") }
        let script = root.appendingPathComponent("scripts/h2_upstream.py").path
        return try await ScratchDirectory.make("portico") { directory in
            let events = directory.appendingPathComponent("events").path
            return try await ExternalServer.retryingPorts { port in
                try await ExternalServer(executable: python, arguments: [script, String(port), events],
                                         port: port, directory: directory)
            }
        }
    }

    /// The upstream's events so far.
    public static func events(of server: ExternalServer) -> [Event] {
        let text = (try? String(contentsOf: server.directory.appendingPathComponent("events"), encoding: .utf8)) ?? ""
        return text.split(separator: "\n").compactMap { try? JSONDecoder().decode(Event.self, from: Data($0.utf8)) }
    }

    /// Waits (polling, up to `timeout`) until an event satisfies `match`.
    public static func waitForEvent(of server: ExternalServer, timeout: Duration = .seconds(60),
                                    _ match: (Event) -> Bool) async -> Event? {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while ContinuousClock.now < deadline {
            if let event = events(of: server).first(where: match) { return event }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return nil
    }

    /// Byte `i` of a `/slow` body.
    public static func pattern(_ count: Int) -> [UInt8] {
        (0..<count).map { UInt8(($0 * 7 + 3) % 256) }
    }
}
