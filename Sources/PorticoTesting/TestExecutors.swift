import NIOCore
import NIOPosix
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
///
/// Loops of their own, not NIO's shared ones: the gateways, Redis and token clients the tests
/// make run on `EventLoops.shared`, and test servers beside them on the same two loops starved
/// them in turn (session 17: 11 failures in a clean-clone run of the whole suite).
public enum TestExecutors {
    /// The test servers' own loops, never shut down (like NIO's shared group).
    public static let servers = EventLoops(count: 2)

    /// Their group, for the servers' bootstraps.
    public static var group: MultiThreadedEventLoopGroup { servers.group }

    /// One executor per event loop (for `ServerConfiguration.taskExecutors`).
    public static var loops: [any TaskExecutor] { servers.executors }

    /// The executor of `loop` (a channel's), so that a connection's task runs where its I/O does.
    public static func executor(for loop: any EventLoop) -> any TaskExecutor {
        servers.executors.first { $0.eventLoop === loop } ?? servers.executors[0]
    }
}
