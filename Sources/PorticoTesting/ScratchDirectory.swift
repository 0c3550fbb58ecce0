import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Temporary directories the test helpers make for their child processes' files (configs, logs,
/// event files). Nothing is left in the system's temporary directory:
/// - its owner removes each one when done (`remove`, or `ChildProcess.stopInBackground`);
/// - what is still here when the test process exits normally (a `stop()` from a `defer` whose
///   background reaping had not finished yet) is removed by an exit handler;
/// - what a test process killed before its exit handler left behind is removed by the next one
///   (the name carries its maker's pid: `PREFIX-PID-UUID`, removed once that process is gone).
public enum ScratchDirectory {
    /// A new, empty directory `PREFIX-PID-UUID` in the temporary directory.
    public static func make(_ prefix: String) throws -> URL {
        _ = installed
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(getpid())-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        live.withLock { _ = $0.insert(url.path) }
        return url
    }

    /// A new directory for `start`, which hands it to what it returns (whose `stop` removes it);
    /// if `start` throws, the directory is removed at once (the error should carry what its logs said).
    public static func make<T>(_ prefix: String, for start: (URL) async throws -> T) async throws -> T {
        let directory = try make(prefix)
        do {
            return try await start(directory)
        } catch {
            remove(directory)
            throw error
        }
    }

    /// Removes `directory` and all in it (no error if it is already gone).
    public static func remove(_ directory: URL) {
        try? FileManager.default.removeItem(at: directory)
        live.withLock { _ = $0.remove(directory.path) }
    }

    /// Directories made by this process and not removed yet, for the exit handler (which cannot
    /// capture anything).
    private static let live = Mutex<Set<String>>([])

    /// Once per process, before the first directory: the exit handler, and the sweep of what
    /// killed test processes left.
    private static let installed: Void = {
        atexit {
            for path in ScratchDirectory.live.withLock({ $0 }) { try? FileManager.default.removeItem(atPath: path) }
        }
        removeOrphans()
    }()

    /// Removes `portico…-PID-UUID` directories whose process no longer exists.
    private static func removeOrphans() {
        let temporary = FileManager.default.temporaryDirectory
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: temporary.path) else { return }
        for name in names where name.hasPrefix("portico") {
            guard let pid = makerPID(name), pid != getpid(), kill(pid, 0) != 0, errno == ESRCH else { continue }
            try? FileManager.default.removeItem(at: temporary.appendingPathComponent(name))
        }
    }

    /// The pid in a name `make` chose, or nil for any other name.
    static func makerPID(_ name: String) -> pid_t? {
        let uuidLength = 36
        guard name.count > uuidLength + 2, UUID(uuidString: String(name.suffix(uuidLength))) != nil else { return nil }
        let head = name.dropLast(uuidLength + 1)
        guard name.dropFirst(head.count).first == "-", let dash = head.lastIndex(of: "-") else { return nil }
        return pid_t(head[head.index(after: dash)...]).flatMap { $0 > 0 ? $0 : nil }
    }
}
