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

    @Test("SIGTERM drains and stops the proxy and admin listeners (through ServiceGroup): exit status 0")
    func sigtermStops() async throws {
        try #require(FileManager.default.isExecutableFile(atPath: Self.binary), "build the portico product first")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-command-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let output = directory.appendingPathComponent("out").path
        let process = try ChildProcess(executable: Self.binary, arguments: ["demo", "--port", "0", "--admin-port", "0"],
                                       standardOutput: .file(output), standardError: .file(output))
        let log: @Sendable () -> String = { (try? String(contentsOfFile: output, encoding: .utf8)) ?? "" }
        do {
            try await Eventually.wait(timeout: .seconds(60), "both listeners") {
                log().contains("msg=\"admin listening\"") && log().contains("msg=listening")
            }
            // `msg=listening address=127.0.0.1 port=N`: the proxy's port, chosen by the kernel.
            let line = try #require(log().split(separator: "\n").first { $0.contains("msg=listening") })
            let port = try #require(line.split(separator: " ").first { $0.hasPrefix("port=") }.flatMap { Int($0.dropFirst(5)) })
            let connection = try RawHTTPConnection(port: port)
            try await connection.send("GET /ping HTTP/1.1\r\nHost: demo\r\n\r\n")
            #expect(try await connection.readResponse()?.status == 200)
            process.signal(SIGTERM)
            let status = await process.waitForExit(timeout: .seconds(60))
            #expect(status == 0, "\(log())")
            #expect(log().contains("msg=stopped"))
        } catch {
            await process.terminate()
            throw error
        }
    }
}
