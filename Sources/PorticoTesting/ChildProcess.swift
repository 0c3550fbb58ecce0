import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A child process (nginx, python3, openssl, curl) started with `posix_spawn`.
///
/// Not Foundation's `Process`: on Linux with Swift 6.3 its `run()` intermittently segfaults
/// reading past a `dirent` while listing `/proc/self/fd` (swift-corelibs-foundation PR #5472),
/// which took the whole test process down, and its `waitUntilExit` spins a run loop that can
/// hang inside Swift concurrency. Here the child gets only stdin, stdout and stderr (every
/// other descriptor is closed in the child by `closefrom`), and exits are observed by polling
/// `waitpid(WNOHANG)`, so no thread ever blocks on a child.
public final class ChildProcess: Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// Where the child's stdout or stderr goes.
    public enum Output: Sendable {
        case null
        /// Created or truncated.
        case file(String)
    }

    public let pid: pid_t
    public let executable: String
    /// The wait status once the child has been reaped; after that `pid` is never used again
    /// (the kernel may have given it to another process).
    private let reaped = Mutex<Int32?>(nil)

    public init(executable: String, arguments: [String], standardOutput: Output = .null,
                standardError: Output = .null) throws(Failure) {
        self.executable = executable
        var actions = posix_spawn_file_actions_t()
        var attributes = posix_spawnattr_t()
        try Self.check(posix_spawn_file_actions_init(&actions), "posix_spawn_file_actions_init")
        defer { posix_spawn_file_actions_destroy(&actions) }
        try Self.check(posix_spawnattr_init(&attributes), "posix_spawnattr_init")
        defer { posix_spawnattr_destroy(&attributes) }

        try Self.check(posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0), "redirect stdin")
        for (descriptor, output) in [(Int32(1), standardOutput), (Int32(2), standardError)] {
            let path: String
            switch output {
            case .null: path = "/dev/null"
            case .file(let file): path = file
            }
            try Self.check(posix_spawn_file_actions_addopen(&actions, descriptor, path, O_WRONLY | O_CREAT | O_TRUNC, 0o644),
                           "redirect descriptor \(descriptor) to \(path)")
        }
        // Sockets of the test process (the gateway's listener, client connections) must not
        // live on in the child, where they would keep ports bound and connections open.
        try Self.check(Self.closeFrom(&actions, 3), "posix_spawn_file_actions_addclosefrom_np")

        // The test process ignores SIGPIPE; the child starts with default signal handling.
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGPIPE)
        sigaddset(&defaults, SIGCHLD)
        var unblocked = sigset_t()
        sigemptyset(&unblocked)
        try Self.check(posix_spawnattr_setsigdefault(&attributes, &defaults), "posix_spawnattr_setsigdefault")
        try Self.check(posix_spawnattr_setsigmask(&attributes, &unblocked), "posix_spawnattr_setsigmask")
        try Self.check(posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK)),
                       "posix_spawnattr_setflags")

        let argv = ([executable] + arguments).map { strdup($0) }
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let status = (argv + [nil]).withUnsafeBufferPointer { argvPointer in
            posix_spawn(&pid, executable, &actions, &attributes, argvPointer.baseAddress!, environ)
        }
        guard status == 0 else {
            throw Failure(description: "cannot start \(executable): \(String(cString: strerror(status)))")
        }
        self.pid = pid
    }

    /// The exit code (128 + signal number when killed by a signal), or nil while it runs.
    public var exitStatus: Int32? {
        reaped.withLock { reaped -> Int32? in
            if reaped == nil {
                var status: Int32 = 0
                let result = waitpid(pid, &status, WNOHANG)
                if result == pid || (result < 0 && errno == ECHILD) { reaped = result == pid ? status : 0 }
            }
            return reaped.map(Self.exitCode)
        }
    }

    public var isRunning: Bool { exitStatus == nil }

    /// Sends `signal` unless the child is already reaped (its pid may belong to another process).
    public func signal(_ signal: Int32) {
        reaped.withLock { reaped in
            if reaped == nil { _ = kill(pid, signal) }
        }
    }

    /// Waits up to `timeout` for the exit, polling without holding a thread; nil if still running.
    public func waitForExit(timeout: Duration) async -> Int32? {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while ContinuousClock.now < deadline {
            if let status = exitStatus { return status }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return exitStatus
    }

    /// The same for callers on their own thread (not a Swift concurrency one).
    public func waitForExitOnThisThread(timeout: Duration) -> Int32? {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while ContinuousClock.now < deadline {
            if let status = exitStatus { return status }
            usleep(5_000)
        }
        return exitStatus
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL; reaps the child either way.
    public func terminate(grace: Duration = .seconds(10)) async {
        signal(SIGTERM)
        if await waitForExit(timeout: grace) != nil { return }
        signal(SIGKILL)
        _ = await waitForExit(timeout: .seconds(10))
    }

    /// The executable called `name` on PATH (or in the usual system directories).
    public static func locate(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin"
        for directory in path.split(separator: ":") + ["/usr/local/bin", "/usr/bin", "/usr/sbin", "/sbin"] {
            let candidate = "\(directory)/\(name)"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        return nil
    }

    private static func exitCode(_ status: Int32) -> Int32 {
        let signal = status & 0x7f
        return signal == 0 ? (status >> 8) & 0xff : 128 + signal
    }

    private static func check(_ result: Int32, _ what: String) throws(Failure) {
        guard result == 0 else { throw Failure(description: "\(what) failed: \(String(cString: strerror(result)))") }
    }

    /// glibc (2.34+) has `posix_spawn_file_actions_addclosefrom_np`, but Swift's Glibc module
    /// does not declare it, so it is looked up by name.
    private typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32

    private static func closeFrom(_ actions: UnsafeMutablePointer<posix_spawn_file_actions_t>, _ lowest: Int32) -> Int32 {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
            return ENOSYS
        }
        return unsafeBitCast(symbol, to: CloseFrom.self)(actions, lowest)
    }
}

extension ChildProcess {
    /// SIGTERM now; reaped in the background (SIGKILL as a last resort), then `directory`
    /// removed. Returns at once, so it can be called from `defer`.
    public func stopInBackground(removing directory: URL) {
        signal(SIGTERM)
        Task.detached { [self] in
            await terminate()
            ScratchDirectory.remove(directory)
        }
    }
}
