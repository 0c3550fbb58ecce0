import NIOCore
import Synchronization

/// What the in-process test servers share: a bound NIO server channel whose connections are each
/// served in a child task, and a shutdown that closes the listener and waits for every task.
final class LoopbackServer<Connection: Sendable>: Sendable {
    typealias Server = NIOAsyncChannel<Connection, Never>

    private let state = Mutex<(server: Server?, task: Task<Void, Never>?)>((nil, nil))

    /// Starts serving `server`'s connections with `serve`; returns the bound port.
    func run(_ server: Server, serve: @escaping @Sendable (Connection) async -> Void) -> Int {
        let task = Task<Void, Never> {
            _ = try? await server.executeThenClose { inbound in
                try await withThrowingDiscardingTaskGroup { group in
                    for try await connection in inbound {
                        group.addTask { await serve(connection) }
                    }
                }
            }
        }
        state.withLock { $0 = (server, task) }
        return server.channel.localAddress?.port ?? 0
    }

    /// Closes the listener, cancels the connections' tasks and waits for them.
    func shutdown() async {
        let (server, task) = state.withLock { $0 }
        try? await server?.channel.close()
        task?.cancel()
        await task?.value
    }
}
