import Foundation
import Synchronization

/// Starts child processes one at a time. Foundation's `Process.run()` on Linux crashed inside
/// itself (a bad `memmove`) when tests launched `openssl`, `nginx` and `curl` from several
/// threads at once; launching is rare and fast, so serialising it costs nothing.
public enum ChildProcess {
    private static let launching = Mutex(())

    public static func launch(_ process: Process) throws {
        try launching.withLock { _ in try process.run() }
    }
}
