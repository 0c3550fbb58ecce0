import Synchronization

/// Keys whose last response could not be stored, and until when ("hit-for-pass"), in a fixed
/// table of atomic words: a request for such a key learns that it goes upstream on its own with
/// one load, without the coalescer's lock (issue #42). A key's mark is one word — 24 bits of its
/// hash (a tag) and the instant it lapses, in milliseconds (40 bits) — in the slot its hash
/// picks, so it is read and written whole.
///
/// Lossy by design, and bounded: two keys of one slot overwrite each other's marks, and a tag
/// shared by two keys of one slot (one chance in 16.7 million) lets the other one pass too.
/// Either costs at most a wait behind another request's fetch, or one request fetched alone
/// (whose response is still stored if it may be).
///
/// `@unchecked Sendable`: the buffer is allocated and initialised once in `init`, deinitialised
/// in `deinit`, and in between every access goes through an `Atomic` operation on one element.
final class PassMarks: @unchecked Sendable {
    private let words: UnsafeMutablePointer<Atomic<UInt64>>
    private let mask: Int
    let slots: Int
    /// Instants are stored as milliseconds after this one, plus `bias` (so that instants up to
    /// 17 years before it, from a clock that started earlier, still fit).
    private let reference = ContinuousClock.now

    private static let timeBits: UInt64 = 40
    private static let timeMask: UInt64 = (1 << timeBits) - 1
    private static let bias: Int64 = 1 << 39

    /// `slots` rounded up to a power of two.
    init(slots: Int) {
        var size = 1
        while size < slots { size <<= 1 }
        self.slots = size
        mask = size - 1
        words = .allocate(capacity: size)
        for index in 0..<size { (words + index).initialize(to: Atomic<UInt64>(0)) }
    }

    deinit {
        words.deinitialize(count: slots)
        words.deallocate()
    }

    /// When the mark of the key with this hash lapses; nil when it has none.
    @inline(__always)
    func until(hash: Int) -> ContinuousClock.Instant? {
        let word = words[hash & mask].load(ordering: .relaxed)
        guard word != 0, word >> Self.timeBits == Self.tag(hash) else { return nil }
        let milliseconds = Int64(word & Self.timeMask) - Self.bias
        return reference.advanced(by: .milliseconds(milliseconds))
    }

    /// Marks the key with this hash until `instant` (rounded down to the millisecond).
    func mark(hash: Int, until instant: ContinuousClock.Instant) {
        let (seconds, attoseconds) = reference.duration(to: instant).components
        var milliseconds = seconds &* 1_000 &+ attoseconds / 1_000_000_000_000_000
        if attoseconds < 0, attoseconds % 1_000_000_000_000_000 != 0 { milliseconds -= 1 }
        let time = UInt64(min(Int64(Self.timeMask), max(1, milliseconds &+ Self.bias)))
        words[hash & mask].store(Self.tag(hash) << Self.timeBits | time, ordering: .relaxed)
    }

    /// The hash's top 24 bits: independent of the slot, which its low bits pick.
    @inline(__always)
    private static func tag(_ hash: Int) -> UInt64 {
        UInt64(bitPattern: Int64(hash)) >> timeBits
    }
}
