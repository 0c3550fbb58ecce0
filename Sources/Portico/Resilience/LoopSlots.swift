import Synchronization

/// A fixed row of atomic words for one event loop's bookkeeping (its requests in flight per
/// endpoint, its round-robin turn, its random state): the loop writes them, and a reader (the
/// admin report) only loads them. Each row is its own allocation, padded by a cache line, so two
/// loops' rows never share one.
///
/// `@unchecked Sendable`: the buffer is allocated and initialised once in `init`, deinitialised
/// in `deinit`, and in between every access goes through an `Atomic` operation on one element;
/// the pointer itself never changes.
final class LoopSlots: @unchecked Sendable {
    private let words: UnsafeMutablePointer<Atomic<Int>>
    let count: Int
    /// Eight words (a cache line) of padding after the row.
    private static let padding = 8

    init(count: Int) {
        self.count = count
        words = .allocate(capacity: count + Self.padding)
        for index in 0..<(count + Self.padding) {
            (words + index).initialize(to: Atomic<Int>(0))
        }
    }

    deinit {
        words.deinitialize(count: count + Self.padding)
        words.deallocate()
    }

    @inline(__always)
    func load(_ index: Int) -> Int {
        words[index].load(ordering: .relaxed)
    }

    @inline(__always)
    func store(_ index: Int, _ value: Int) {
        words[index].store(value, ordering: .relaxed)
    }

    @inline(__always)
    func add(_ index: Int, _ delta: Int) {
        words[index].wrappingAdd(delta, ordering: .relaxed)
    }
}
