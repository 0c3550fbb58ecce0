import Synchronization

/// Where the cache keeps responses. Synchronous on purpose: the in-memory store answers under
/// a lock in well under a microsecond, and a hit should not pay for an actor hop or a
/// suspension. A store that needs I/O would sit behind its own in-memory front. `insert` is
/// also called on the thread that sends a streamed response to the client (libmicrohttpd's),
/// when the response is complete: it must never block for long or wait.
public protocol CacheStore: Sendable {
    /// The variants stored under `key`, most recently stored first; marks the key as used.
    func variants(for key: String) -> [CacheEntry]
    /// Stores `entry`, replacing the variant with the same `Vary` values, evicting the least
    /// recently used keys to stay within the byte limit.
    @discardableResult func insert(_ entry: CacheEntry) -> CacheStoreChange
    /// Removes every variant stored under `key` (invalidation).
    @discardableResult func removeAll(for key: String) -> CacheStoreChange
    var storedBytes: Int { get }
}

/// What a store operation did, for metrics.
public struct CacheStoreChange: Sendable, Equatable {
    /// Keys evicted to make room (not counting explicit removals).
    public var evictions: Int
    public var storedBytes: Int
    /// Whether anything stored changed; when not, there is nothing for the metrics to record.
    public var changed: Bool = true
}

/// A bounded in-memory store: LRU by primary key, charged by bytes. Each key holds at most
/// `maxVariants` variants (the oldest goes first), so one URI with many `Vary` values cannot
/// crowd out the rest.
public final class InMemoryCacheStore: CacheStore {
    public static let defaultMaxVariants = 32

    private struct Slot {
        var key: String
        var variants: [CacheEntry]
        var bytes: Int
        var newer: Int?
        var older: Int?
    }

    /// A doubly linked recency list over array slots, with a free list: no allocation per hit.
    private struct State {
        var index: [String: Int] = [:]
        var slots: [Slot] = []
        var free: [Int] = []
        var newest: Int?
        var oldest: Int?
        var bytes = 0

        mutating func unlink(_ i: Int) {
            let (newer, older) = (slots[i].newer, slots[i].older)
            if let newer { slots[newer].older = older } else { newest = older }
            if let older { slots[older].newer = newer } else { oldest = newer }
            slots[i].newer = nil
            slots[i].older = nil
        }

        mutating func pushNewest(_ i: Int) {
            slots[i].older = newest
            slots[i].newer = nil
            if let newest { slots[newest].newer = i }
            newest = i
            if oldest == nil { oldest = i }
        }

        mutating func remove(_ i: Int, presence: KeyPresence) {
            unlink(i)
            bytes -= slots[i].bytes
            index[slots[i].key] = nil
            presence.removed(hash: slots[i].key.hashValue)
            slots[i].variants = []
            slots[i].bytes = 0
            free.append(i)
        }
    }

    public let maxBytes: Int
    public let maxVariants: Int
    private let state = Mutex(State())
    /// Bumped by every change to what is stored (under the lock): a thread's `Front` is valid
    /// while this has not moved. Read on every lookup, written only when something is stored
    /// or removed: on a cache serving hits, a line every core reads and none writes.
    private let generation = Atomic<UInt64>(0)
    /// One per thread shard (`ThreadShard`): what this thread looked up since the last change.
    private let fronts: [Front]
    /// Which keys may be stored, without the lock: a request for a key never stored (what a
    /// pass-through asks) takes neither the lock nor its thread's front.
    private let presence: KeyPresence
    /// `State.bytes` as of the last change, for an answer that changed nothing (no lock).
    private let bytesAtLastChange = Atomic<Int>(0)

    public init(maxBytes: Int, maxVariants: Int = InMemoryCacheStore.defaultMaxVariants) {
        self.maxBytes = maxBytes
        self.maxVariants = max(1, maxVariants)
        self.fronts = (0..<ThreadShard.count).map { _ in Front() }
        self.presence = KeyPresence(buckets: KeyPresence.buckets(forMaxBytes: maxBytes))
    }

    /// A thread's copy of its recent lookups, so that a hit on a hot key takes no lock that
    /// every thread takes (issue #33). Valid for one `generation`: any store or removal
    /// anywhere empties every front on its next use. Recency is still kept: every
    /// `Front.touchEvery`-th hit of a key from a front moves it up the shared LRU list.
    ///
    /// `@unchecked Sendable`: `fronts[i]` is only used by the thread holding shard `i`
    /// exclusively (`ThreadShard.exclusive`); a thread without an exclusive shard uses the lock.
    private final class Front: @unchecked Sendable {
        static let capacity = 64
        static let touchEvery: UInt = 64
        var generation: UInt64 = .max
        var entries: [String: [CacheEntry]] = [:]
        var hits: UInt = 0
        /// Keeps each front on cache lines of its own.
        private let padding: (Int, Int, Int, Int, Int, Int, Int, Int) = (0, 0, 0, 0, 0, 0, 0, 0)
    }

    public var storedBytes: Int { state.withLock { $0.bytes } }

    /// Keys stored, for tests and diagnostics.
    public var keyCount: Int { state.withLock { $0.index.count } }

    public func variants(for key: String) -> [CacheEntry] {
        guard presence.mayContain(hash: key.hashValue) else { return [] }
        let shard = ThreadShard.current
        guard shard.exclusive else { return lockedVariants(for: key) }
        let front = fronts[shard.index]
        let current = generation.load(ordering: .acquiring)
        if front.generation == current, let known = front.entries[key] {
            // A key known to be absent (another key shares its presence bucket) has no place
            // in the LRU list to keep.
            guard !known.isEmpty else { return known }
            front.hits &+= 1
            if front.hits % Front.touchEvery == 0 { _ = lockedVariants(for: key) }
            return known
        }
        if front.generation != current || front.entries.count >= Front.capacity {
            front.entries.removeAll(keepingCapacity: true)
            front.generation = current
        }
        // Read after `current`: a change since then moved the generation, and this copy is
        // never served under it.
        let variants = lockedVariants(for: key)
        front.entries[key] = variants
        return variants
    }

    /// The stored variants, moved up the LRU list.
    private func lockedVariants(for key: String) -> [CacheEntry] {
        state.withLock { state in
            guard let i = state.index[key] else { return [] }
            if state.newest != i {
                state.unlink(i)
                state.pushNewest(i)
            }
            return state.slots[i].variants
        }
    }

    @discardableResult
    public func insert(_ entry: CacheEntry) -> CacheStoreChange {
        let size = entry.size
        guard size <= maxBytes else {
            return CacheStoreChange(evictions: 0, storedBytes: bytesAtLastChange.load(ordering: .relaxed), changed: false)
        }
        return state.withLock { state in
            let i: Int
            if let existing = state.index[entry.key] {
                i = existing
                state.unlink(i)
            } else {
                if let reused = state.free.popLast() {
                    i = reused
                    state.slots[i] = Slot(key: entry.key, variants: [], bytes: 0)
                } else {
                    i = state.slots.count
                    state.slots.append(Slot(key: entry.key, variants: [], bytes: 0))
                }
                state.index[entry.key] = i
                presence.added(hash: entry.key.hashValue)
            }
            var variants = state.slots[i].variants.filter { $0.vary != entry.vary }
            variants.insert(entry, at: 0)
            if variants.count > maxVariants { variants.removeLast(variants.count - maxVariants) }
            let bytes = variants.reduce(0) { $0 + $1.size }
            state.bytes += bytes - state.slots[i].bytes
            state.slots[i].variants = variants
            state.slots[i].bytes = bytes
            state.pushNewest(i)
            var evictions = 0
            while state.bytes > maxBytes, let oldest = state.oldest, oldest != i {
                state.remove(oldest, presence: presence)
                evictions += 1
            }
            // The new key alone may still exceed the limit through its other variants.
            while state.bytes > maxBytes, state.slots[i].variants.count > 1 {
                let dropped = state.slots[i].variants.removeLast()
                state.slots[i].bytes -= dropped.size
                state.bytes -= dropped.size
            }
            generation.wrappingAdd(1, ordering: .releasing)
            bytesAtLastChange.store(state.bytes, ordering: .relaxed)
            return CacheStoreChange(evictions: evictions, storedBytes: state.bytes)
        }
    }

    /// An invalidation of a key never stored (most of them: every successful unsafe request
    /// asks for one) takes no lock.
    @discardableResult
    public func removeAll(for key: String) -> CacheStoreChange {
        guard presence.mayContain(hash: key.hashValue) else {
            return CacheStoreChange(evictions: 0, storedBytes: bytesAtLastChange.load(ordering: .relaxed), changed: false)
        }
        return state.withLock { state in
            guard let i = state.index[key] else {
                return CacheStoreChange(evictions: 0, storedBytes: state.bytes, changed: false)
            }
            state.remove(i, presence: presence)
            generation.wrappingAdd(1, ordering: .releasing)
            bytesAtLastChange.store(state.bytes, ordering: .relaxed)
            return CacheStoreChange(evictions: 0, storedBytes: state.bytes)
        }
    }

    /// Removes every key whose entries `target` matches (a purge, or an invalidation another
    /// replica published); returns how many keys went. Walks every key under the lock: an
    /// operator's purge, not a request's work.
    @discardableResult
    public func removeAll(matching target: CachePurgeTarget) -> (removed: Int, change: CacheStoreChange) {
        if case .key(let key) = target {
            let change = removeAll(for: key)
            return (change.changed ? 1 : 0, change)
        }
        return removeAll { key, variants in variants.contains { target.matches(key: key, fields: $0.headerFields) } }
    }

    /// Empties the store (the fleet's invalidations were missed: nothing here can be trusted).
    @discardableResult
    public func removeEverything() -> (removed: Int, change: CacheStoreChange) {
        removeAll { _, _ in true }
    }

    private func removeAll(where doomed: (String, [CacheEntry]) -> Bool) -> (removed: Int, change: CacheStoreChange) {
        state.withLock { state in
            let slots = state.index.values.filter { doomed(state.slots[$0].key, state.slots[$0].variants) }
            for i in slots { state.remove(i, presence: presence) }
            if !slots.isEmpty {
                generation.wrappingAdd(1, ordering: .releasing)
                bytesAtLastChange.store(state.bytes, ordering: .relaxed)
            }
            return (slots.count, CacheStoreChange(evictions: 0, storedBytes: state.bytes, changed: !slots.isEmpty))
        }
    }
}
