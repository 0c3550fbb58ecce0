import Foundation

/// The Python that runs the tests' helper scripts: scripts/test's virtual environment
/// (`.build/test-python`, with the PyPI packages the tests use), else the python3 on PATH.
public enum TestPython {
    /// The package's root folder.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// The first of the two that can `import modules` (e.g. "jsonschema, yaml"); nil when neither can.
    public static func interpreter(importing modules: String) -> String? {
        let candidates: [String?] = [root.appendingPathComponent(".build/test-python/bin/python3").path,
                                     ChildProcess.locate("python3")]
        for case let candidate? in candidates where FileManager.default.isExecutableFile(atPath: candidate) {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: candidate)
            process.arguments = ["-c", "import \(modules)"]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            guard (try? process.run()) != nil else { continue }
            process.waitUntilExit()
            if process.terminationStatus == 0 { return candidate }
        }
        return nil
    }
}
