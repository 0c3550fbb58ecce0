import Synchronization

/// Memory for per-shard metric cells: one region per shard, each starting on its own pair of
/// cache lines (128 bytes: the adjacent-line prefetcher pairs lines), so what one thread writes
/// never shares a line with what another thread writes. Metrics take consecutive cells in every
/// region: a counter one cell, a histogram a cell per bucket plus its sum. Packing many metrics
/// into a region costs 8 bytes per metric and shard, where a padded line per metric and shard
/// would cost 64.
///
/// Cells are `Atomic<Int64>`, written with relaxed atomic adds: normally by the one thread that
/// holds the shard, by several when there are more threads than shards. Readers (the merge on
/// `/metrics`) load them relaxed; a cell only grows (wrapping), so a merged total never goes back.
final class CellSlab: @unchecked Sendable {
    // @unchecked: `base` is allocated in `init`, freed in `deinit`, and in between every cell
    // in it is an initialised `Atomic<Int64>`, only ever accessed through its atomic operations.
    private let base: UnsafeMutableRawPointer
    /// Bytes per shard region, a multiple of 128.
    let stride: Int
    let cellsPerShard: Int

    static let alignment = 128

    init(cellsPerShard: Int) {
        let stride = (cellsPerShard * 8 + Self.alignment - 1) / Self.alignment * Self.alignment
        self.stride = stride
        self.cellsPerShard = stride / 8
        base = .allocate(byteCount: stride * ThreadShard.count, alignment: Self.alignment)
        let cells = base.bindMemory(to: Atomic<Int64>.self, capacity: self.cellsPerShard * ThreadShard.count)
        for shard in 0..<ThreadShard.count {
            for cell in 0..<self.cellsPerShard {
                (cells + shard * self.cellsPerShard + cell).initialize(to: Atomic(0))
            }
        }
    }

    deinit {
        let cells = base.assumingMemoryBound(to: Atomic<Int64>.self)
        cells.deinitialize(count: cellsPerShard * ThreadShard.count)
        base.deallocate()
    }

    @inline(__always)
    func cell(shard: Int, _ offset: Int) -> UnsafeMutablePointer<Atomic<Int64>> {
        (base + shard * stride).assumingMemoryBound(to: Atomic<Int64>.self) + offset
    }
}

/// A metric's cells: `count` consecutive cells in each shard region of a slab. Holding it keeps
/// the slab alive; writing goes through `first` and never touches the slab object (whose
/// reference count every thread would otherwise share).
struct CellBlock: @unchecked Sendable {
    // @unchecked: `first` points into `slab`, which this value keeps alive; the cells there
    // are atomics.
    let slab: CellSlab
    /// Shard 0's first cell of this block; shard `s`'s is `stride` bytes on per shard.
    private let first: UnsafeMutableRawPointer
    private let stride: Int
    let count: Int

    init(slab: CellSlab, offset: Int, count: Int) {
        self.slab = slab
        first = UnsafeMutableRawPointer(slab.cell(shard: 0, offset))
        stride = slab.stride
        self.count = count
    }

    /// The first of `shard`'s cells of this block.
    @inline(__always)
    func cells(shard: Int) -> UnsafeMutablePointer<Atomic<Int64>> {
        (first + shard * stride).assumingMemoryBound(to: Atomic<Int64>.self)
    }

    @inline(__always)
    func add(_ amount: Int64, cell: Int = 0, shard: Int = ThreadShard.current.index) {
        cells(shard: shard)[cell].wrappingAdd(amount, ordering: .relaxed)
    }

    /// The sum of one cell over all shards (wrapping).
    func total(cell: Int = 0) -> Int64 {
        var total: Int64 = 0
        for shard in 0..<ThreadShard.count {
            total &+= cells(shard: shard)[cell].load(ordering: .relaxed)
        }
        return total
    }
}

/// Hands out cell blocks from slabs. Taken when a metric handle is made, never when one is
/// written. Cells are not reused: handles are made once per label set (the factory dedupes
/// them), so memory grows with the number of series, which Portico keeps bounded.
final class CellArena: Sendable {
    private struct State {
        var slab: CellSlab?
        var used = 0
    }

    private let state = Mutex(State())
    /// Cells per shard in a slab: 1 KiB per shard, room for 128 counters or six histograms.
    static let slabCells = 128

    func allocate(_ count: Int) -> CellBlock {
        state.withLock { state in
            if let slab = state.slab, state.used + count <= slab.cellsPerShard {
                defer { state.used += count }
                return CellBlock(slab: slab, offset: state.used, count: count)
            }
            let slab = CellSlab(cellsPerShard: max(Self.slabCells, count))
            state.slab = slab
            state.used = count
            return CellBlock(slab: slab, offset: 0, count: count)
        }
    }
}
