import NIOCore
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The calling thread's shard of per-thread state: metric cells, merged only when read, and the
/// cache store's fronts (issue #33).
///
/// A thread gets its index on its first use, from a bitmap of free indices, and gives it back
/// when it exits, so a thread that comes later reuses it. While it holds an index it holds it
/// *exclusively*: no other live thread has it, which lets `ShardLocal` keep unsynchronised state
/// per shard. Threads beyond `count` share indices (round robin) and are not exclusive: metric
/// cells stay correct for them because every write is an atomic add, and `ShardLocal` sends
/// them to its shared path.
public struct ThreadShard: Sendable, Equatable {
    public let index: Int
    /// No other live thread has `index`.
    public let exclusive: Bool

    /// Enough for a daemon thread and an event loop per core, plus the listener, the admin
    /// listener and a few pool threads; more threads than this still work (see above).
    public static let count: Int = min(1024, max(32, 2 * System.coreCount + 8))

    /// The calling thread's shard. A thread-specific value after the first call (one
    /// `pthread_getspecific`), no lock and no shared write.
    @inline(__always)
    public static var current: ThreadShard {
        if let raw = pthread_getspecific(key) { return ThreadShard(encoded: UInt(bitPattern: raw)) }
        return assign()
    }

    private init(index: Int, exclusive: Bool) {
        self.index = index
        self.exclusive = exclusive
    }

    /// Stored as `index << 1 | exclusive`, plus one so that it is never null.
    private init(encoded: UInt) {
        let value = Int(encoded - 1)
        self.init(index: value >> 1, exclusive: value & 1 == 1)
    }

    private var encoded: UInt { UInt((index << 1) | (exclusive ? 1 : 0)) + 1 }

    private static func assign() -> ThreadShard {
        let shard = if let index = free.claim() {
            ThreadShard(index: index, exclusive: true)
        } else {
            ThreadShard(index: overflow.wrappingAdd(1, ordering: .relaxed).oldValue % count, exclusive: false)
        }
        pthread_setspecific(key, UnsafeRawPointer(bitPattern: shard.encoded))
        return shard
    }

    /// Gives an exclusive index back when its thread exits.
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let created = pthread_key_create(&key) { raw in
            guard let raw else { return }
            let shard = ThreadShard(encoded: UInt(bitPattern: raw))
            if shard.exclusive { ThreadShard.free.release(shard.index) }
        }
        precondition(created == 0, "pthread_key_create failed")
        return key
    }()

    private static let free = ShardBitmap(count: count)
    /// Hands out shared indices to threads beyond `count`; touched once per such thread.
    private static let overflow = Atomic<Int>(0)
}

/// Which shard indices are held, one bit each: claimed and released with atomic operations on
/// their words, so assigning a shard takes no lock.
final class ShardBitmap: Sendable {
    private let words: [AtomicWord]
    private let count: Int

    /// An `Atomic` cannot be an array element; a class around it can.
    private final class AtomicWord: Sendable {
        let bits = Atomic<UInt64>(0)
    }

    init(count: Int) {
        self.count = count
        words = (0..<(count + 63) / 64).map { _ in AtomicWord() }
    }

    /// The lowest free index, now held; nil when all are. Acquiring, so a new holder sees every
    /// write the previous holder made before its `release`.
    func claim() -> Int? {
        for (number, word) in words.enumerated() {
            var bits = word.bits.load(ordering: .relaxed)
            while true {
                let valid = min(64, count - number * 64)
                let freeBits = ~bits & (valid == 64 ? ~0 : (UInt64(1) << UInt64(valid)) - 1)
                guard freeBits != 0 else { break }
                let bit = freeBits.trailingZeroBitCount
                let (exchanged, original) = word.bits.compareExchange(
                    expected: bits, desired: bits | (UInt64(1) << UInt64(bit)), ordering: .acquiring)
                if exchanged { return number * 64 + bit }
                bits = original
            }
        }
        return nil
    }

    func release(_ index: Int) {
        words[index / 64].bits.bitwiseAnd(~(UInt64(1) << UInt64(index % 64)), ordering: .releasing)
    }
}
