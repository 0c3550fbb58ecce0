import Foundation
import PorticoTesting
import Testing

/// `portico explain` and `portico check`'s admin exposure rule, run as the binary.
@Suite("portico explain and check, as a command")
struct ExplainCommandTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Runs the binary; returns its exit status, stdout and stderr.
    static func portico(_ arguments: [String]) async throws -> (status: Int32?, out: String, err: String) {
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the portico product first")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-explain-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let out = directory.appendingPathComponent("out").path, err = directory.appendingPathComponent("err").path
        let process = try ChildProcess(executable: CommandTests.binary, arguments: arguments,
                                       standardOutput: .file(out), standardError: .file(err))
        let status = await process.waitForExit(timeout: .seconds(60))
        if status == nil { await process.terminate() }
        return (status, (try? String(contentsOfFile: out, encoding: .utf8)) ?? "", (try? String(contentsOfFile: err, encoding: .utf8)) ?? "")
    }

    @Test("explain prints the route, the chain, the stripped upstream URL and the deadlines; --json the endpoint's JSON")
    func explain() async throws {
        let config = Self.root.appendingPathComponent("config/portico.yaml").path
        let text = try await Self.portico(["explain", "--config", config, "-H", "Host: a.inventory.example.com",
                                           "http://a.inventory.example.com/inventory/items?id=3"])
        #expect(text.status == 0, "\(text.err)")
        #expect(text.out.contains("Routing: route inventory"))
        #expect(text.out.contains("  ✓ inventory (any method host *.inventory.example.com prefix /inventory/)"))
        #expect(text.out.contains("  2. inventory-auth (auth): sets X-API-Key from credential api-key"))
        #expect(text.out.contains("  GET http://127.0.0.1:9001/api/v2/items?id=3"))
        #expect(text.out.contains("Deadlines: total 30s (listen.request_timeout)"))
        #expect(!text.out.contains("dev-key"))

        let json = try await Self.portico(["explain", "--config", config, "-X", "DELETE", "--json", "http://x.test/orders/1"])
        #expect(json.status == 0, "\(json.err)")
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.out.utf8)) as? [String: Any])
        #expect(object["outcome"] as? String == "no route allows the method: 405 method_not_allowed (Allow: GET, POST)")

        let bad = try await Self.portico(["explain", "--config", config, "orders"])
        #expect(bad.status == 2 && bad.err.contains("\"orders\" is not a URL"))
    }

    @Test("check refuses an admin address off loopback without admin.token, naming file, line and key")
    func checkRefusesExposedAdmin() async throws {
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("portico-exposed-\(UUID().uuidString).yaml")
        defer { try? FileManager.default.removeItem(at: file) }
        try "admin:\n  address: 0.0.0.0\nroutes:\n  - name: ping\n    match: { path: /ping }\n    direct: { body: pong }\n"
            .write(to: file, atomically: true, encoding: .utf8)
        let result = try await Self.portico(["check", "--config", file.path])
        #expect(result.status == 1)
        #expect(result.err.contains("\(file.path):2 admin.address: \"0.0.0.0\" is not a loopback address"), "\(result.err)")
    }
}
