import Foundation
import PorticoTesting
import Testing

/// The admin dashboard in headless Chromium, driven by Playwright (scripts/dashboard-check.py)
/// against `portico demo`. scripts/test installs both tools and sets PORTICO_REQUIRE_BROWSER=1,
/// so there a missing tool fails the test; elsewhere the test is skipped, saying why.
@Suite("Admin dashboard in a browser")
struct DashboardBrowserTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    static let chromium = "/usr/bin/chromium"

    /// A Python that can import playwright: scripts/test's virtual environment, else the one on PATH.
    static let python: String? = TestPython.interpreter(importing: "playwright")

    static var missing: String? {
        if !FileManager.default.isExecutableFile(atPath: chromium) { return "\(chromium) is not installed (apt-get install chromium)" }
        if python == nil { return "Python's playwright is not installed (pip install playwright)" }
        return nil
    }

    static var required: Bool { ProcessInfo.processInfo.environment["PORTICO_REQUIRE_BROWSER"] == "1" }

    @Test("the page loads without console errors, lists the demo's routes, moves with traffic and shows a stopped IdP failing",
          .enabled(if: missing == nil || required, "skipped: \(missing ?? ""); scripts/test installs it"))
    func dashboard() async throws {
        if let missing = Self.missing { Issue.record("PORTICO_REQUIRE_BROWSER=1 but \(missing)"); return }
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the portico product first")
        let python = try #require(Self.python)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-dashboard-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let output = directory.appendingPathComponent("out").path
        let script = Self.root.appendingPathComponent("scripts/dashboard-check.py").path
        let arguments = [script, "--portico", CommandTests.binary, "--chromium", Self.chromium]
        let process = try ChildProcess(executable: python, arguments: arguments, standardOutput: .file(output), standardError: .file(output))
        let status = await process.waitForExit(timeout: .seconds(180))
        if status == nil { await process.terminate() }
        let log = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        #expect(status == 0, "\(log)")
        #expect(log.contains("dashboard: ok"), "\(log)")
    }
}
