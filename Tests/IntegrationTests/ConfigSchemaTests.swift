import Foundation
import PorticoTesting
import Testing

/// `portico schema` from the built binary, checked by an independent validator: Python's
/// `jsonschema` (Draft 2020-12) through scripts/config-schema-check.py. scripts/test installs
/// jsonschema and PyYAML in .build/test-python; without them the tests fail, saying so.
@Suite("portico schema, validated by Python's jsonschema")
struct ConfigSchemaTests {
    static let root = DashboardBrowserTests.root

    static let examples: [String] = {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("config/examples").path)) ?? []
        return names.filter { $0.hasSuffix(".yaml") }.sorted().map { "config/examples/\($0)" }
    }()

    /// scripts/test's virtual environment, else the python3 on PATH, if it has both packages.
    static let python: String? = TestPython.interpreter(importing: "jsonschema, yaml")

    /// Runs `executable arguments…`, returning its exit status and its output (stdout and stderr).
    static func run(_ executable: String, _ arguments: [String], in directory: URL) async throws -> (status: Int32?, output: String) {
        let output = directory.appendingPathComponent("out-\(UUID().uuidString)").path
        let process = try ChildProcess(executable: executable, arguments: arguments,
                                       standardOutput: .file(output), standardError: .file(output))
        let status = await process.waitForExit(timeout: .seconds(120))
        if status == nil { await process.terminate() }
        return (status, (try? String(contentsOfFile: output, encoding: .utf8)) ?? "")
    }

    /// `portico schema`'s output in a fresh directory, and that directory.
    static func printedSchema() async throws -> (schema: String, directory: URL) {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the portico product first")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-schema-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let schema = directory.appendingPathComponent("portico.schema.json").path
        let process = try ChildProcess(executable: CommandTests.binary, arguments: ["schema"],
                                       standardOutput: .file(schema), standardError: .file(directory.appendingPathComponent("stderr").path))
        let status = await process.waitForExit(timeout: .seconds(60))
        if status == nil { await process.terminate() }
        #expect(status == 0)
        return (schema, directory)
    }

    @Test("config/portico.yaml and every example validate against the printed schema")
    func shippedFilesValidate() async throws {
        let python = try #require(Self.python, "Python's jsonschema and PyYAML are needed (scripts/test installs them in .build/test-python)")
        let (schema, directory) = try await Self.printedSchema()
        defer { try? FileManager.default.removeItem(at: directory) }
        let files = ["config/portico.yaml"] + Self.examples
        #expect(files.count >= 4)
        let script = Self.root.appendingPathComponent("scripts/config-schema-check.py").path
        let (status, output) = try await Self.run(python, [script, "--schema", schema]
            + files.map { Self.root.appendingPathComponent($0).path }, in: directory)
        #expect(status == 0, "\(output)")
        for file in files {
            #expect(output.contains("\(file): valid"), "\(output)")
        }
    }

    @Test("a wrong type, an unknown key, a bad unit or a misspelt choice fails validation, at its path",
          arguments: [
            ("listen: { port: eighty }", "listen/port"),
            ("listen: { idle_timout: 5s }", "'idle_timout' was unexpected"),
            ("listen: { idle_timeout: 30 }", "listen/idle_timeout"),
            ("logging: { format: xml }", "logging/format"),
            ("middleware: { c: { type: cache, max_bytes: lots } }", "middleware/c/max_bytes"),
            ("middleware: { r: { type: retry, on: [404] } }", "middleware/r/on/0"),
            ("middleware: { a: { type: auth } }", "'credential' is a required property"),
            ("upstreams: { u: { url: http://x, tls: { verify_depth: 2 } } }", "'verify_depth' was unexpected"),
            ("routes:\n  - { name: a, match: { path: /a, path_prefix: /a/ }, direct: { body: a } }", "routes/0/match"),
          ] as [(String, String)])
    func invalidFails(section: String, expected: String) async throws {
        let python = try #require(Self.python, "Python's jsonschema and PyYAML are needed (scripts/test installs them in .build/test-python)")
        let (schema, directory) = try await Self.printedSchema()
        defer { try? FileManager.default.removeItem(at: directory) }
        let config = directory.appendingPathComponent("bad.yaml")
        let routes = section.contains("routes:") ? "" : "\nroutes:\n  - { name: ping, match: { path: /ping }, direct: { body: pong } }"
        try (section + routes + "\n")
            .write(to: config, atomically: true, encoding: .utf8)
        let script = Self.root.appendingPathComponent("scripts/config-schema-check.py").path
        let (status, output) = try await Self.run(python, [script, "--schema", schema, config.path], in: directory)
        #expect(status == 1, "\(output)")
        #expect(output.contains(expected), "\(output)")
        #expect(!output.contains("bad.yaml: valid"))
    }

    @Test("interpolated values validate wherever the loader interpolates: numbers, booleans, durations, sizes, choices")
    func interpolationValidates() async throws {
        let python = try #require(Self.python, "Python's jsonschema and PyYAML are needed (scripts/test installs them in .build/test-python)")
        let (schema, directory) = try await Self.printedSchema()
        defer { try? FileManager.default.removeItem(at: directory) }
        let config = directory.appendingPathComponent("env.yaml")
        try """
            listen: { port: "${PORT:-8080}", idle_timeout: "${IDLE:-60s}", max_body_bytes: "${MAX_BODY:-1MiB}" }
            admin: { enabled: "${ADMIN:-true}", public_metrics: yes }
            logging: { level: "${LOG_LEVEL:-info}" }
            routes:
              - { name: ping, match: { path: /ping }, direct: { status: "${STATUS:-200}", body: 42 } }
            """.write(to: config, atomically: true, encoding: .utf8)
        let script = Self.root.appendingPathComponent("scripts/config-schema-check.py").path
        let (status, output) = try await Self.run(python, [script, "--schema", schema, config.path], in: directory)
        #expect(status == 0, "\(output)")
    }
}
