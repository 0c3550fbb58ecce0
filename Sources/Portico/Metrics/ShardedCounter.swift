import CoreMetrics
import Synchronization

/// A counter kept per shard (`ShardedMetricsFactory`): `increment` adds to the calling thread's
/// cell; `flush` adds what the cells gained since the last flush to the backend's counter.
public final class ShardedCounter: CounterHandler, Sendable {
    let base: any CounterHandler
    let cells: CellBlock
    /// The cells' total at the last flush (or reset). Taken by the reader only, never per request.
    private let flushed = Mutex<Int64>(0)

    init(base: any CounterHandler, cells: CellBlock) {
        self.base = base
        self.cells = cells
    }

    @inline(__always)
    public func increment(by amount: Int64) {
        cells.add(amount)
    }

    /// Counts since the last flush are dropped; the backend's counter is reset.
    public func reset() {
        flushed.withLock { flushed in
            flushed = cells.total()
            base.reset()
        }
    }

    func flush() {
        flushed.withLock { flushed in
            let total = cells.total()
            let delta = total &- flushed
            flushed = total
            if delta > 0 { base.increment(by: delta) }
        }
    }
}

/// A meter (a gauge moved up and down, e.g. requests in flight) kept per shard: increments and
/// decrements add to the calling thread's cell (a `Double`'s bits, added with a compare-and-swap
/// that succeeds at once when one thread writes the cell); `flush` moves the backend's gauge by
/// what the cells moved since. `set` is absolute: it goes to the backend at once and drops the
/// moves not flushed yet (they happened before it).
public final class ShardedMeter: MeterHandler, Sendable {
    let base: any MeterHandler
    let cells: CellBlock
    private let flushed = Mutex<Double>(0)

    init(base: any MeterHandler, cells: CellBlock) {
        self.base = base
        self.cells = cells
    }

    public func set(_ value: Int64) { set(Double(value)) }

    public func set(_ value: Double) {
        flushed.withLock { flushed in
            flushed = total()
            base.set(value)
        }
    }

    @inline(__always)
    public func increment(by amount: Double) {
        Self.add(amount, to: cells.cells(shard: ThreadShard.current.index))
    }

    @inline(__always)
    public func decrement(by amount: Double) {
        Self.add(-amount, to: cells.cells(shard: ThreadShard.current.index))
    }

    func flush() {
        flushed.withLock { flushed in
            let now = total()
            let delta = now - flushed
            flushed = now
            if delta > 0 { base.increment(by: delta) } else if delta < 0 { base.decrement(by: -delta) }
        }
    }

    private func total() -> Double {
        var total = 0.0
        for shard in 0..<ThreadShard.count {
            total += Double(bitPattern: UInt64(bitPattern: cells.cells(shard: shard).pointee.load(ordering: .relaxed)))
        }
        return total
    }

    /// Adds to a cell holding a `Double`'s bits.
    @inline(__always)
    static func add(_ amount: Double, to cell: UnsafeMutablePointer<Atomic<Int64>>) {
        var bits = cell.pointee.load(ordering: .relaxed)
        while true {
            let sum = Double(bitPattern: UInt64(bitPattern: bits)) + amount
            let (exchanged, original) = cell.pointee.compareExchange(
                expected: bits, desired: Int64(bitPattern: sum.bitPattern), ordering: .relaxed)
            if exchanged { return }
            bits = original
        }
    }
}
