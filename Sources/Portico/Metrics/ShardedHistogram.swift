import CoreMetrics
import Synchronization

/// A histogram kept per shard, rendered by `ShardedMetricsFactory` in swift-prometheus's format.
///
/// Each shard has a cell per bucket (not cumulative: a value counts in the first bucket whose
/// bound is at least the value, or in the last cell, above every bound) and a cell for the sum.
/// A record is a binary search and two atomic adds on the caller's cells, where
/// swift-prometheus's `Histogram` takes one lock every thread shares and walks all buckets.
/// Reading sums the shards; the count is the sum of the bucket cells, so `+Inf` and `_count`
/// always agree with the buckets.
protocol ShardedHistogram: AnyObject, Sendable {
    var name: String { get }
    func emit(into buffer: inout [UInt8])
}

/// `Timer`s: bounds and the sum in whole nanoseconds (what `recordNanoseconds` gets).
public final class ShardedTimer: TimerHandler, ShardedHistogram, @unchecked Sendable {
    // @unchecked: `bounds` is written once in `init` and freed in `deinit`; in between it is
    // only read. Everything else is immutable or `CellBlock` (atomic cells).
    let name: String
    let labels: [UInt8]?
    let cells: CellBlock
    /// Upper bounds in nanoseconds (a bound `b` contains value `v` iff `v <= b`; for whole
    /// nanoseconds that is `v <= floor(b)`), ascending.
    let bounds: UnsafeMutableBufferPointer<Int64>
    private let boundTexts: [String]

    init(name: String, labels: [(String, String)], buckets: [Duration], arena: CellArena) {
        self.name = name
        self.labels = PrometheusExposition.labels(labels)
        let sorted = buckets.sorted()
        bounds = .allocate(capacity: sorted.count)
        _ = bounds.initialize(fromContentsOf: sorted.map(GatewayMetrics.nanoseconds))
        boundTexts = sorted.map(PrometheusExposition.duration)
        cells = arena.allocate(sorted.count + 2)
    }

    deinit {
        bounds.deallocate()
    }

    public func recordNanoseconds(_ duration: Int64) {
        view(shard: ThreadShard.current.index).record(duration)
    }

    /// This histogram as one shard writes it: no reference counting, no lookup.
    func view(shard: Int) -> TimerCell {
        TimerCell(cells: cells.cells(shard: shard), bounds: UnsafeBufferPointer(bounds))
    }

    func emit(into buffer: inout [UInt8]) {
        let buckets = (0...bounds.count).map { cells.total(cell: $0) }
        let sum = cells.total(cell: bounds.count + 1)
        PrometheusExposition.histogram(name: name, labels: labels, bounds: boundTexts, buckets: buckets,
                                       sum: PrometheusExposition.duration(.nanoseconds(sum)), into: &buffer)
    }
}

/// One shard's cells of a `ShardedTimer`. Valid while the timer lives: whoever holds one holds
/// the timer too.
struct TimerCell: @unchecked Sendable {
    // @unchecked: both pointers point into memory owned by a `ShardedTimer` the holder keeps
    // alive; `cells` are atomics, `bounds` is read-only.
    let cells: UnsafeMutablePointer<Atomic<Int64>>
    let bounds: UnsafeBufferPointer<Int64>

    @inline(__always)
    func record(_ nanoseconds: Int64) {
        var low = 0, high = bounds.count
        while low < high {
            let middle = (low + high) / 2
            if bounds[middle] >= nanoseconds { high = middle } else { low = middle + 1 }
        }
        cells[low].wrappingAdd(1, ordering: .relaxed)
        cells[bounds.count + 1].wrappingAdd(nanoseconds, ordering: .relaxed)
    }
}

/// Aggregating `Recorder`s: `Double` bounds, the sum a `Double`'s bits.
public final class ShardedValueHistogram: RecorderHandler, ShardedHistogram, Sendable {
    let name: String
    let labels: [UInt8]?
    let cells: CellBlock
    let bounds: [Double]
    private let boundTexts: [String]

    init(name: String, labels: [(String, String)], buckets: [Double], arena: CellArena) {
        self.name = name
        self.labels = PrometheusExposition.labels(labels)
        bounds = buckets.sorted()
        boundTexts = bounds.map(\.description)
        cells = arena.allocate(bounds.count + 2)
    }

    public func record(_ value: Int64) { record(Double(value)) }

    public func record(_ value: Double) {
        // NaN is above no bound: it lands in `+Inf` only, as in swift-prometheus.
        let index = bounds.firstIndex { $0 >= value } ?? bounds.count
        let cells = cells.cells(shard: ThreadShard.current.index)
        cells[index].wrappingAdd(1, ordering: .relaxed)
        ShardedMeter.add(value, to: cells + bounds.count + 1)
    }

    func emit(into buffer: inout [UInt8]) {
        let buckets = (0...bounds.count).map { cells.total(cell: $0) }
        var sum = 0.0
        for shard in 0..<ThreadShard.count {
            let bits = cells.cells(shard: shard)[bounds.count + 1].load(ordering: .relaxed)
            sum += Double(bitPattern: UInt64(bitPattern: bits))
        }
        PrometheusExposition.histogram(name: name, labels: labels, bounds: boundTexts, buckets: buckets,
                                       sum: sum.description, into: &buffer)
    }
}
