import Logging
import Synchronization

/// One client per `stores.NAME`, built with the runtime.
///
/// A reload builds new stores with `previous:` the old ones: a store whose configuration did
/// not change keeps its connections (requests still running on the old runtime use them too).
/// Clients are shared between generations and counted; the last to let go closes one.
public final class RateLimitStores: Sendable {
    /// A client and how many generations hold it.
    final class Handle: Sendable {
        let backend: RedisBucketStore
        let owners = OwnerCount()

        init(_ backend: RedisBucketStore) {
            self.backend = backend
        }
    }

    private let handles: [String: Handle]
    private let released = Mutex(false)

    /// No stores.
    public init() {
        handles = [:]
    }

    /// Clients for `stores`, reusing `previous`'s for unchanged configurations. New ones start
    /// connecting in the background; a store that is down only shows in the log. Each keeps its
    /// connections on `loops` (the gateway's), so a request's command goes out on its own loop.
    public init(stores: [String: StoreConfig], previous: RateLimitStores? = nil, loops: EventLoops = .shared,
                logger: Logger) throws {
        var handles: [String: Handle] = [:]
        do {
            for name in stores.keys.sorted() {
                let config = stores[name]!
                if let old = previous?.handles[name], old.backend.config == config, old.owners.retain() {
                    handles[name] = old
                    continue
                }
                let backend = try RedisBucketStore(name: name, config: config, loops: loops, logger: logger)
                backend.warmUp()
                handles[name] = Handle(backend)
            }
        } catch {
            Self.release(Array(handles.values))
            throw GatewayRuntime.BuildError(description: "stores: \(error)")
        }
        self.handles = handles
    }

    public func backend(named name: String) -> RedisBucketStore? {
        handles[name]?.backend
    }

    /// Lets go of every client; those no newer generation reused close their connections. Idempotent.
    public func shutdown() async {
        guard markReleased() else { return }
        for handle in handles.values where handle.owners.release() {
            await handle.backend.shutdown()
        }
    }

    /// For stores that never came into service (their runtime failed to build).
    func discard() {
        guard markReleased() else { return }
        Self.release(Array(handles.values))
    }

    private func markReleased() -> Bool {
        released.withLock { released in
            defer { released = true }
            return !released
        }
    }

    private static func release(_ handles: [Handle]) {
        let last = handles.filter { $0.owners.release() }.map(\.backend)
        guard !last.isEmpty else { return }
        Task {
            for backend in last { await backend.shutdown() }
        }
    }
}
