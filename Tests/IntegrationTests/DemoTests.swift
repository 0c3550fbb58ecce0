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
        // The WebSocket line runs the Python scripts/demo would give it: scripts/test's has websockets too.
        let python = WebSocketLab.python
        let lines = DemoSetup.lines(port: gateway.port, adminPort: 0, python: python).filter { !$0.usesAdmin }
        for round in 1...2 {
            for line in lines {
                let websocket = line.command.contains("websockets")
                if websocket, python == nil { continue }
                let (output, errors) = try await Shell.run(line.command)
                let expected = try Regex(line.expected)
                #expect(output.wholeMatch(of: expected) != nil, "paste \(round): \(line.command)\n\(output)")
                // Python's own warnings (a deprecated call) are noise a user would see.
                if websocket { #expect(errors.isEmpty, "paste \(round): \(line.command)\n\(errors)") }
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

    @Test("given scripts/demo's Python, the WebSocket line runs it by its path (quoted when it must be)")
    func websocketPython() {
        let plain = DemoSetup.lines(port: 8080, adminPort: 9901, python: "/srv/portico/.build/demo-python/bin/python3")
        #expect(plain.contains { $0.command.hasPrefix("/srv/portico/.build/demo-python/bin/python3 -c 'with ") })
        let spaced = DemoSetup.banner(port: 8080, adminPort: 9901, upstreamPort: 40000, python: "/home/a user/it's/bin/python3")
        #expect(spaced.contains(#"'/home/a user/it'\''s/bin/python3' -c 'with "#))
        #expect(!spaced.contains("pip install"))
        #expect(DemoSetup.banner(port: 8080, adminPort: 9901, upstreamPort: 40000).contains("python3 -c 'with "))
    }
}

/// Runs one line with `/bin/sh -c`, as pasted, and returns its standard output and error.
enum Shell {
    static func run(_ command: String) async throws -> (output: String, errors: String) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-shell-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let outPath = directory.appendingPathComponent("out").path
        let errPath = directory.appendingPathComponent("err").path
        let process = try ChildProcess(executable: "/bin/sh", arguments: ["-c", command], standardOutput: .file(outPath),
                                       standardError: .file(errPath))
        if await process.waitForExit(timeout: .seconds(60)) == nil {
            await process.terminate()
        }
        return ((try? String(contentsOfFile: outPath, encoding: .utf8)) ?? "", (try? String(contentsOfFile: errPath, encoding: .utf8)) ?? "")
    }
}
