import Foundation
import PorticoTesting
import Testing

/// The `portico` executable itself, as built next to the tests.
@Suite("The portico command")
struct CommandTests {
    static var binary: String {
        URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("portico").path
    }

    @Test("a port already taken: one critical line and exit status 1, never a crash", arguments: ["proxy", "admin"])
    func portTaken(which: String) async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "build the portico product first")
        let taken = TestUpstream()
        try await taken.start()
        let free = try RefusingPort()  // a port nothing listens on, for the other listener
        let ports = which == "proxy" ? (taken.port, free.port) : (free.port, taken.port)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-command-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let output = directory.appendingPathComponent("out").path
        withExtendedLifetime(free) {}
        let process = try ChildProcess(executable: Self.binary,
                                       arguments: ["demo", "--port", "\(ports.0)", "--admin-port", "\(ports.1)"],
                                       standardOutput: .file(output), standardError: .file(output))
        let status = await process.waitForExit(timeout: .seconds(60))
        if status == nil { await process.terminate() }
        await taken.shutdown()
        let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        #expect(status == 1, "\(status.map(String.init) ?? "still running"): \(text)")
        #expect(text.contains("cannot start"))
        #expect(text.contains("Address already in use"))
        #expect(!text.contains("Fatal error") && !text.contains("crashed"), "\(text)")
    }
}
