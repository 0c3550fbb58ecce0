import Synchronization

/// Background refreshes for `stale-while-revalidate`: at most one per key and at most `limit`
/// at once. Each runs under its own deadline (set by the caller), and `shutdown` cancels and
/// awaits them all, so none outlives the runtime that started it.
public final class BackgroundRefresher: Sendable {
    private struct State {
        var tasks: [String: (id: UInt64, task: Task<Void, Never>)] = [:]
        var nextID: UInt64 = 0
        var closed = false
    }

    private let state = Mutex(State())
    public let limit: Int

    public init(limit: Int) {
        self.limit = limit
    }

    public var running: Int { state.withLock { $0.tasks.count } }

    /// Starts `operation` for `key` unless one is already running for it, the limit is
    /// reached, or the refresher was shut down. Returns whether it started.
    @discardableResult
    public func start(_ key: String, _ operation: @escaping @Sendable () async -> Void) -> Bool {
        state.withLock { state in
            guard !state.closed, state.tasks[key] == nil, state.tasks.count < limit else { return false }
            state.nextID += 1
            let id = state.nextID
            // Registered before the lock is released, so the task's own removal cannot run first.
            let task = Task { [self] in
                await operation()
                self.state.withLock { state in
                    if state.tasks[key]?.id == id { state.tasks[key] = nil }
                }
            }
            state.tasks[key] = (id, task)
            return true
        }
    }

    /// Cancels every refresh and waits for them to end; later `start` calls are refused.
    public func shutdown() async {
        let tasks = state.withLock { state in
            state.closed = true
            return state.tasks.values.map(\.task)
        }
        for task in tasks { task.cancel() }
        for task in tasks { await task.value }
    }
}
