import Synchronization

/// How `stop` waits for the server to empty without polling: shards `poke` it whenever a request
/// completes, a stream ends or an admission is withdrawn, and the waiter re-checks its condition
/// then. While nobody waits, `poke` is one relaxed load of a flag that only `wait` writes.
final class Quiescence: Sendable {
    private let watching = Atomic<Bool>(false)
    private let pokes = Mutex<AsyncStream<Void>.Continuation?>(nil)

    /// Something that `wait`'s condition depends on changed. Any thread.
    func poke() {
        guard watching.load(ordering: .relaxed) else { return }
        _ = pokes.withLock { $0 }?.yield()
    }

    /// Waits until `condition` holds (true), or `timeout` passes (false). One waiter at a time.
    func wait(timeout: Duration, until condition: @escaping @Sendable () -> Bool) async -> Bool {
        let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        pokes.withLock { $0 = continuation }
        watching.store(true, ordering: .sequentiallyConsistent)
        defer {
            watching.store(false, ordering: .relaxed)
            pokes.withLock { $0 = nil }
            continuation.finish()
        }
        // Checked after watching is on: a change before it is seen here, one after it pokes.
        if condition() { return true }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                for await _ in stream where condition() { return true }
                return false
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            let result = await group.next() ?? false
            group.cancelAll()
            continuation.finish()
            return result
        }
    }
}
