import Synchronization

/// Which keys a store may hold, answered without the store's lock (issue #42): a counting filter,
/// one atomic count of stored keys per bucket of key hashes. A count of zero proves the key is
/// not stored, so a lookup or an invalidation of a key that was never stored — every request a
/// cache passes through (`no-store`, `Authorization`, unsafe methods) — costs one load of a line
/// that changes only when a key is stored or removed, and no lock. A nonzero count may be
/// another key of the same bucket: the caller then asks the store itself.
///
/// Counts change only under the store's lock, with release ordering; lookups load with acquire
/// ordering, so a lookup that finds a count sees the stored key.
///
/// `@unchecked Sendable`: the buffer is allocated and initialised once in `init`, deinitialised
/// in `deinit`, and in between every access goes through an `Atomic` operation on one element.
final class KeyPresence: @unchecked Sendable {
    private let counts: UnsafeMutablePointer<Atomic<Int32>>
    private let mask: Int
    let buckets: Int

    /// `buckets` rounded up to a power of two.
    init(buckets: Int) {
        var size = 1
        while size < buckets { size <<= 1 }
        self.buckets = size
        mask = size - 1
        counts = .allocate(capacity: size)
        for index in 0..<size { (counts + index).initialize(to: Atomic<Int32>(0)) }
    }

    deinit {
        counts.deinitialize(count: buckets)
        counts.deallocate()
    }

    /// One bucket per 16 KiB a store may hold (4 bytes each: 0.025 % of `maxBytes`), between
    /// 1,024 and 1,048,576: a store full of entries of 16 KiB leaves most buckets of never-stored
    /// keys empty; one full of smaller ones sends more of them to the lock, never a wrong answer.
    static func buckets(forMaxBytes maxBytes: Int) -> Int {
        min(1 << 20, max(1 << 10, maxBytes / (16 << 10)))
    }

    /// `false` only when no key with this hash is stored.
    @inline(__always)
    func mayContain(hash: Int) -> Bool {
        counts[hash & mask].load(ordering: .acquiring) != 0
    }

    /// A key with this hash was stored (called under the store's lock).
    func added(hash: Int) {
        counts[hash & mask].wrappingAdd(1, ordering: .releasing)
    }

    /// A key with this hash was removed (called under the store's lock).
    func removed(hash: Int) {
        counts[hash & mask].wrappingSubtract(1, ordering: .releasing)
    }
}
