import Foundation
import Portico
import PorticoTesting
import Testing

/// `portico demo`'s configuration and printed lines, run as a user runs them: with the shell and curl.
@Suite("portico demo")
struct DemoTests {
    @Test("every printed line answers as printed, pasted twice in a row")
    func linesTwice() async throws {
        let demo = try DemoSetup()
        let gateway = try TestGateway(try demo.config(port: 0, adminPort: 0, environment: [:]))
        let lines = DemoSetup.lines(port: gateway.port, adminPort: 0).filter { !$0.usesAdmin }
        for round in 1...2 {
            for line in lines {
                var command = line.command
                if command.hasPrefix("python3 ") {
                    // The WebSocket line needs Python's websockets: scripts/test's environment has it.
                    guard let python = WebSocketLab.python else { continue }
                    command = python + command.dropFirst("python3".count)
                }
                let output = try await Shell.run(command)
                let expected = try Regex(line.expected)
                #expect(output.wholeMatch(of: expected) != nil, "paste \(round): \(line.command)\n\(output)")
            }
        }
        await gateway.stop()
        await demo.stop()
    }

    @Test("the banner prints each line as a pasteable command, notes as comments of their own")
    func banner() {
        let banner = DemoSetup.banner(port: 8080, adminPort: 9901, upstreamPort: 40000)
        let lines = DemoSetup.lines(port: 8080, adminPort: 9901)
        let printed = banner.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        for line in lines {
            #expect(printed.contains(line.command))
            if let note = line.note { #expect(printed.contains("# \(note)")) }
        }
        #expect(banner.contains("admin on http://127.0.0.1:9901"))
        let commands = printed.filter { $0.hasPrefix("curl") || $0.hasPrefix("run=") || $0.hasPrefix("for ") || $0.hasPrefix("python3 ") }
        #expect(commands.count == lines.count)
    }
}

/// Runs one line with `/bin/sh -c`, as pasted, and returns its standard output.
enum Shell {
    static func run(_ command: String) async throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-shell-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let outPath = directory.appendingPathComponent("out").path
        let process = try ChildProcess(executable: "/bin/sh", arguments: ["-c", command], standardOutput: .file(outPath))
        if await process.waitForExit(timeout: .seconds(60)) == nil {
            await process.terminate()
        }
        return (try? String(contentsOfFile: outPath, encoding: .utf8)) ?? ""
    }
}
