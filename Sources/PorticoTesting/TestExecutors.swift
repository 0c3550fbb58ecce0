import NIOCore
import Portico

/// Where the test servers' own work runs: NIO's process-wide event loops (`EventLoops.shared`),
/// as the gateway's runs on its loops, never the global concurrent executor.
///
/// Why: the whole suite runs in one process, and on two cores that executor has two threads.
/// Synchronous tests (the seeded fuzzers, property tests, thread-pinning metrics tests) hold
/// them for seconds each, far longer on a loaded machine; measured beside two busy loops,
/// trivial tests waited 7.5 s to start. A test server whose accept loop, handlers or deadline
/// watchdog waited behind them answered late or not at all: an upstream past the gateway's
/// timeout (504 `upstream_timeout`), a per-try timeout cutting every try, a hang-up or a slow
/// body noticed after the test's deadline. On the loops, a server keeps time as a real one
/// would, whatever the tests beside it do.
public enum TestExecutors {
    /// One executor per event loop (for `ServerConfiguration.taskExecutors`).
    public static var loops: [any TaskExecutor] { EventLoops.shared.executors }

    /// The executor of `loop` (a channel's), so that a connection's task runs where its I/O does.
    public static func executor(for loop: any EventLoop) -> any TaskExecutor {
        EventLoops.shared.executors.first { $0.eventLoop === loop } ?? EventLoops.shared.executors[0]
    }
}
