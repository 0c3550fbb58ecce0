import Synchronization

/// Caps the extra load retries add, so a failing upstream sees at most `(1 + ratio)` times its
/// normal traffic instead of `attempts` times (a retry storm would prolong the outage).
///
/// A sliding window of `slots` buckets counts original requests and retries. A retry is
/// allowed while retries in the window stay within `max(ratio × requests, minPerSecond ×
/// window)`: the floor lets a quiet route still retry an occasional failure. One budget is
/// shared by every route using the middleware instance.
///
/// Confinement (issue #42): every request is counted, so counting takes no lock and writes no
/// line another thread writes. Requests are counted per thread shard (`ThreadShard`), in that
/// shard's own cells (`CellSlab`: 128 bytes apart), with a relaxed atomic exchange; a thread
/// without an exclusive shard shares cells with others and still counts exactly, since every
/// change is one atomic operation. Only a retry — on a failure — sums the shards, under a lock
/// that only retries take.
public final class RetryBudget: Sendable {
    public let ratio: Double
    public let minPerSecond: Int
    public let window: Duration

    private let slotNanoseconds: Int64
    private let slotCount: Int
    /// Requests by shard and slot: one cell per slot in each shard's region, each holding the
    /// slot's epoch and its count (`RequestCell`).
    private let requests: CellBlock
    /// The instant epochs count from, as nanoseconds after `reference`; set by the first call
    /// (`unset` before), so epochs are counted on whatever clock the caller uses. Written once,
    /// then only read: a line every core keeps a copy of.
    private let origin = Atomic<Int64>(RetryBudget.unset)
    private let reference = ContinuousClock.now
    /// Retries by slot. Only a retry, or a read of the counts, takes it.
    private let retries: Mutex<[RetrySlot]>

    private static let unset = Int64.min

    private struct RetrySlot {
        var epoch = Int.min
        var count = 0
    }

    public init(ratio: Double, minPerSecond: Int, window: Duration = .seconds(10), slots: Int = 10) {
        self.ratio = ratio
        self.minPerSecond = minPerSecond
        self.window = window
        slotCount = max(1, slots)
        slotNanoseconds = max(1, Self.nanoseconds(window) / Int64(slotCount))
        requests = CellBlock(slab: CellSlab(cellsPerShard: slotCount), offset: 0, count: slotCount)
        retries = Mutex(Array(repeating: RetrySlot(), count: slotCount))
    }

    /// Counts an original request (call once per request, before any retry). No lock: one
    /// atomic exchange on the calling thread's own cell.
    public func recordRequest(at now: ContinuousClock.Instant) {
        let epoch = epoch(at: now)
        let cell = requests.cells(shard: ThreadShard.current.index) + epoch % slotCount
        var seen = cell.pointee.load(ordering: .relaxed)
        while true {
            let desired = RequestCell(bits: seen).counting(epoch: epoch).bits
            let (exchanged, original) = cell.pointee.weakCompareExchange(
                expected: seen, desired: desired, ordering: .relaxed)
            if exchanged { return }
            seen = original
        }
    }

    /// Takes one retry from the budget; `false` when it is spent.
    public func tryAcquireRetry(at now: ContinuousClock.Instant) -> Bool {
        let epoch = epoch(at: now)
        return retries.withLock { slots in
            // Summed under the lock, so two retries never both take the last one left.
            let requests = requestTotal(epoch: epoch)
            let taken = Self.retryTotal(&slots, epoch: epoch)
            guard Double(taken + 1) <= allowance(requests: requests) else { return false }
            let index = epoch % slotCount
            if slots[index].epoch != epoch { slots[index] = RetrySlot(epoch: epoch) }
            slots[index].count += 1
            return true
        }
    }

    /// Retries allowed in one window with `requests` original requests in it.
    public func allowance(requests: Int) -> Double {
        let windowSeconds = Double(window.components.seconds) + Double(window.components.attoseconds) / 1e18
        return max(ratio * Double(requests), Double(minPerSecond) * windowSeconds)
    }

    /// Original requests and retries in the current window (tests, diagnostics).
    public func counts(at now: ContinuousClock.Instant) -> (requests: Int, retries: Int) {
        let epoch = epoch(at: now)
        return retries.withLock { slots in (requestTotal(epoch: epoch), Self.retryTotal(&slots, epoch: epoch)) }
    }

    /// The slot number of `now`: whole slot lengths since the origin (0 before it).
    private func epoch(at now: ContinuousClock.Instant) -> Int {
        let offset = Self.nanoseconds(reference.duration(to: now))
        var start = origin.load(ordering: .relaxed)
        if start == Self.unset {
            // The first call sets it; a thread that loses the race takes the winner's.
            let (exchanged, original) = origin.compareExchange(expected: Self.unset, desired: offset, ordering: .relaxed)
            start = exchanged ? offset : original
        }
        return Int(max(0, offset &- start) / slotNanoseconds)
    }

    /// Requests in the window ending in `epoch`, summed over every shard's cells.
    private func requestTotal(epoch: Int) -> Int {
        var total = 0
        for shard in 0..<ThreadShard.count {
            let cells = requests.cells(shard: shard)
            for slot in 0..<slotCount {
                total += RequestCell(bits: cells[slot].load(ordering: .relaxed)).count(inWindowOf: slotCount, endingAt: epoch)
            }
        }
        return total
    }

    /// Retries in the window ending in `epoch`; slots older than the window are cleared.
    private static func retryTotal(_ slots: inout [RetrySlot], epoch: Int) -> Int {
        var total = 0
        for i in slots.indices {
            if slots[i].epoch <= epoch - slots.count {
                slots[i] = RetrySlot()
            } else {
                total += slots[i].count
            }
        }
        return total
    }

    private static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return seconds &* 1_000_000_000 &+ attoseconds / 1_000_000_000
    }
}

extension RetryBudget {
    /// One shard's count for one slot, in one 64-bit cell so that a single atomic operation changes
    /// both: the slot's epoch in the high 40 bits (modulo 2^40: at the default 1 s slots, 34,000
    /// years before it wraps) and the requests counted in it in the low 24 (saturating at 16.7
    /// million per slot and shard, far above what one thread serves in a slot).
    fileprivate struct RequestCell: Equatable {
        var bits: Int64

        static let countBits = 24
        static let maxCount: Int64 = (1 << countBits) - 1
        static let epochMask: Int64 = (1 << (64 - countBits)) - 1

        init(bits: Int64) { self.bits = bits }

        init(epoch: Int, count: Int64) {
            bits = (Int64(epoch) & Self.epochMask) << Self.countBits | min(count, Self.maxCount)
        }

        var count: Int64 { bits & Self.maxCount }
        var epochTag: Int64 { (bits >> Self.countBits) & Self.epochMask }

        /// `epoch` minus this cell's epoch, as a signed difference modulo 2^40.
        func distance(to epoch: Int) -> Int64 {
            let difference = (Int64(epoch) &- epochTag) & Self.epochMask
            return difference >= 1 << (63 - Self.countBits) ? difference - (1 << (64 - Self.countBits)) : difference
        }

        /// The cell after counting one more request at `epoch`: a cell of an older epoch starts
        /// again at one; a newer one (the caller's clock read behind another thread's by a whole
        /// window) keeps its epoch and counts the request there, so no request is lost.
        func counting(epoch: Int) -> RequestCell {
            if distance(to: epoch) > 0 { return RequestCell(epoch: epoch, count: 1) }
            return RequestCell(bits: count < Self.maxCount ? bits + 1 : bits)
        }

        /// The count when the cell's epoch lies within `slots` of `epoch` (either side: a writer's
        /// clock may be a little ahead of the reader's), else 0.
        func count(inWindowOf slots: Int, endingAt epoch: Int) -> Int {
            let distance = distance(to: epoch)
            return distance > -Int64(slots) && distance < Int64(slots) ? Int(count) : 0
        }
    }
}
