import Foundation
import PorticoTesting
import Testing

/// `portico schema --markdown` from the built binary: the command the docs name to regenerate
/// docs/configuration.md prints exactly that page (DocumentationTests compares the renderer
/// with the page; this checks the flag reaches the renderer and nothing else is printed).
@Suite("portico schema --markdown")
struct SchemaMarkdownCommandTests {
    /// The package root, found from this file: Tests/IntegrationTests/SchemaMarkdownCommandTests.swift.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// What the binary prints to standard output with `arguments`, and its exit status.
    static func run(_ arguments: [String]) async throws -> (status: Int32?, output: String) {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the portico product first")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-schema-md-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let output = directory.appendingPathComponent("out").path
        let process = try ChildProcess(executable: CommandTests.binary, arguments: arguments,
                                       standardOutput: .file(output), standardError: .file(directory.appendingPathComponent("err").path))
        let status = await process.waitForExit(timeout: .seconds(60))
        if status == nil { await process.terminate() }
        return (status, (try? String(contentsOfFile: output, encoding: .utf8)) ?? "")
    }

    @Test("prints docs/configuration.md as committed, and exits 0")
    func printsThePage() async throws {
        let (status, printed) = try await Self.run(["schema", "--markdown"])
        #expect(status == 0)
        let page = try String(contentsOf: Self.root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
        #expect(printed.hasPrefix("# Configuration reference\n"))
        #expect(printed == page, "docs/configuration.md differs from the command's output: run swift run portico schema --markdown > docs/configuration.md")
    }

    @Test("without the flag it still prints the JSON Schema")
    func jsonByDefault() async throws {
        let (status, printed) = try await Self.run(["schema"])
        #expect(status == 0)
        #expect(printed.hasPrefix("{\n  \"$schema\": \"https://json-schema.org/draft/2020-12/schema\""))
    }
}
