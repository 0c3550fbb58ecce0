import Foundation
import PorticoTesting
import Testing

/// A WebSocket opened by headless Chromium through `portico demo` to its echo route, driven by
/// Playwright as the dashboard's browser test is (scripts/websocket-browser-check.py).
@Suite("WebSocket in a browser")
struct WebSocketBrowserTests {
    @Test("Chromium opens a WebSocket through Portico to the demo's echo route and gets its messages back",
          .enabled(if: DashboardBrowserTests.missing == nil || DashboardBrowserTests.required,
                   "skipped: \(DashboardBrowserTests.missing ?? ""); scripts/test installs it"))
    func echoFromChromium() async throws {
        if let missing = DashboardBrowserTests.missing { Issue.record("PORTICO_REQUIRE_BROWSER=1 but \(missing)"); return }
        try #require(FileManager.default.isExecutableFile(atPath: CommandTests.binary), "build the portico product first")
        let python = try #require(DashboardBrowserTests.python)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("portico-ws-browser-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let output = directory.appendingPathComponent("out").path
        let script = DashboardBrowserTests.root.appendingPathComponent("scripts/websocket-browser-check.py").path
        let arguments = [script, "--portico", CommandTests.binary, "--chromium", DashboardBrowserTests.chromium]
        let process = try ChildProcess(executable: python, arguments: arguments, standardOutput: .file(output), standardError: .file(output))
        let status = await process.waitForExit(timeout: .seconds(180))
        if status == nil { await process.terminate() }
        let log = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
        #expect(status == 0, "\(log)")
        #expect(log.contains("websocket-browser: ok"), "\(log)")
    }
}
