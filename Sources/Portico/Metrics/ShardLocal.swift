import CoreMetrics
import Synchronization

/// One value per shard, read and written without any lock or atomic by the thread that holds
/// the shard exclusively (`ThreadShard.exclusive`). Each value starts its own 128-byte block,
/// so two threads' values never share a cache line.
final class ShardLocal<Value>: @unchecked Sendable {
    // @unchecked: slot `i` is only touched by the thread holding shard `i` exclusively, and
    // `ThreadShard` gives an exclusive index to one live thread at a time. An index passes to a
    // new thread only through `ShardBitmap` (released by the old thread at its exit, claimed
    // with an acquiring exchange), which orders everything the old holder did before
    // everything the new one does. `withCurrent` runs its body synchronously, so it never
    // moves to another thread midway. Values hold metric cells (atomics) and handles.
    private let slots: UnsafeMutableRawPointer
    private static var stride: Int { (MemoryLayout<Value>.stride + 127) / 128 * 128 }

    init(_ initial: Value) {
        slots = .allocate(byteCount: Self.stride * ThreadShard.count, alignment: 128)
        for shard in 0..<ThreadShard.count {
            (slots + shard * Self.stride).initializeMemory(as: Value.self, to: initial)
        }
    }

    deinit {
        for shard in 0..<ThreadShard.count {
            (slots + shard * Self.stride).assumingMemoryBound(to: Value.self).deinitialize(count: 1)
        }
        slots.deallocate()
    }

    /// `body` on the shard's value; nil (without running it) unless the calling thread holds
    /// `shard` exclusively — `shard` must be the caller's `ThreadShard.current`.
    @inline(__always)
    func withValue<Result>(of shard: ThreadShard, _ body: (inout Value) throws -> Result) rethrows -> Result? {
        guard shard.exclusive else { return nil }
        return try body(&(slots + shard.index * Self.stride).assumingMemoryBound(to: Value.self).pointee)
    }
}

/// Metric handles by label set for a hot path: the handles are made once per label set (under
/// a lock, through the factory), and each thread keeps, in its shard, the part it writes —
/// its own cells of a sharded metric — so that a recording takes no lock, writes no line
/// another thread writes and touches no reference count another thread touches. Threads
/// without an exclusive shard (more threads than shards) look handles up under the lock.
///
/// Memory: the handles once per label set, the cells once per label set and shard that used it.
final class HandleCache<Key: Hashable & Sendable, Handles: Sendable, Local>: Sendable {
    private let shared = Mutex<[Key: Handles]>([:])
    private let local = ShardLocal<[Key: Local]>([:])
    private let make: @Sendable (Key) -> Handles
    private let localize: @Sendable (Handles, _ shard: Int) -> Local

    init(make: @escaping @Sendable (Key) -> Handles, localize: @escaping @Sendable (Handles, _ shard: Int) -> Local) {
        self.make = make
        self.localize = localize
    }

    /// The calling thread's part of the handles for `key`.
    @inline(__always)
    subscript(key: Key) -> Local {
        let shard = ThreadShard.current
        return local.withValue(of: shard) { cache in
            if let found = cache[key] { return found }
            let created = localize(handles(key), shard.index)
            cache[key] = created
            return created
        } ?? localize(handles(key), shard.index)
    }

    /// The shared handles (made on first use): taken once per label set and shard.
    func handles(_ key: Key) -> Handles {
        shared.withLock { handles in
            if let existing = handles[key] { return existing }
            let created = make(key)
            handles[key] = created
            return created
        }
    }
}

/// A counter as one shard writes it: that shard's cell of a `ShardedCounter`, or, with any other
/// backend, the handler itself. Valid while the handler lives (`HandleCache` keeps it).
enum CounterCell {
    case cell(UnsafeMutablePointer<Atomic<Int64>>)
    case handler(any CounterHandler)

    init(_ handler: any CounterHandler, shard: Int) {
        if let sharded = handler as? ShardedCounter {
            self = .cell(sharded.cells.cells(shard: shard))
        } else {
            self = .handler(handler)
        }
    }

    @inline(__always)
    func increment(by amount: Int64 = 1) {
        switch self {
        case .cell(let cell): cell.pointee.wrappingAdd(amount, ordering: .relaxed)
        case .handler(let handler): handler.increment(by: amount)
        }
    }
}

/// A timer as one shard writes it (see `CounterCell`).
enum TimerRecorder {
    case cells(TimerCell)
    case handler(any TimerHandler)

    init(_ handler: any TimerHandler, shard: Int) {
        if let sharded = handler as? ShardedTimer {
            self = .cells(sharded.view(shard: shard))
        } else {
            self = .handler(handler)
        }
    }

    @inline(__always)
    func recordNanoseconds(_ nanoseconds: Int64) {
        switch self {
        case .cells(let cells): cells.record(nanoseconds)
        case .handler(let handler): handler.recordNanoseconds(nanoseconds)
        }
    }
}
