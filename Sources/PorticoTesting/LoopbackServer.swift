import NIOCore
import Synchronization

/// A connection `LoopbackServer` serves: an `NIOAsyncChannel`, or an HTTP/2 connection (its
/// channel and stream multiplexer, `TestUpstream`).
protocol LoopbackConnection: Sendable {
    var channel: any Channel { get }
    /// Closes a connection that was accepted but never served.
    func closeUnserved() async
}

extension NIOAsyncChannel: LoopbackConnection {
    func closeUnserved() async {
        try? await executeThenClose { _, _ in }
    }
}

/// What the in-process test servers share: a bound NIO server channel whose connections are each
/// served in a child task, and a shutdown that closes the listener and waits for every task.
final class LoopbackServer<Connection: LoopbackConnection>: Sendable {
    typealias Server = NIOAsyncChannel<Accepted, Never>

    /// An accepted connection, closed properly even if it is never served. NIO traps when an
    /// `NIOAsyncChannel` made with `wrappingChannelSynchronously` is dropped without
    /// `executeThenClose`, and the accept stream drops the connections that arrive as the
    /// listener closes (a client connecting while the test shuts its upstream down).
    final class Accepted: Sendable {
        private let connection: Mutex<Connection?>
        /// Where the connection's task runs: its channel's event loop.
        let executor: any TaskExecutor

        init(_ connection: Connection) {
            self.connection = Mutex(connection)
            executor = TestExecutors.executor(for: connection.channel.eventLoop)
        }

        /// The connection, for the one task that serves it.
        func take() -> Connection? {
            connection.withLock { $0.take() }
        }

        deinit {
            guard let unserved = take() else { return }
            // On its loop too: a close waiting behind the suite's synchronous tests left the
            // client's socket open for seconds after `shutdown`.
            Task(executorPreference: executor) { await unserved.closeUnserved() }
        }
    }

    private let state = Mutex<(server: Server?, task: Task<Void, Never>?)>((nil, nil))

    /// Starts serving `server`'s connections with `serve`; returns the bound port. The accept
    /// loop runs on the listener's event loop and each connection's task on its channel's
    /// (`TestExecutors`): not on the global executor, which the suite's synchronous tests keep busy.
    func run(_ server: Server, serve: @escaping @Sendable (Connection) async -> Void) -> Int {
        let task = Task<Void, Never>(executorPreference: TestExecutors.executor(for: server.channel.eventLoop)) {
            _ = try? await server.executeThenClose { inbound in
                try await withThrowingDiscardingTaskGroup { group in
                    // Ends when `shutdown` closes the listener, after every connection accepted
                    // until then has its task; then those tasks are cancelled.
                    for try await accepted in inbound {
                        group.addTask(executorPreference: accepted.executor) {
                            if let connection = accepted.take() { await serve(connection) }
                        }
                    }
                    group.cancelAll()
                }
            }
        }
        state.withLock { $0 = (server, task) }
        return server.channel.localAddress?.port ?? 0
    }

    /// Closes the listener, which ends the accept loop and cancels the connections' tasks, and
    /// waits for them.
    func shutdown() async {
        let (server, task) = state.withLock { $0 }
        try? await server?.channel.close()
        await task?.value
        // The accept stream may still buffer connections accepted as the listener closed; they
        // are closed when it is released (`Accepted.deinit`), so it must not outlive the
        // shutdown (held here, it kept such a socket open for as long as the test ran).
        state.withLock { $0.server = nil }
    }
}
