import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Numbers unique within the process, drawn without writing anything another thread writes:
/// each thread takes a block of 2^40 from one shared atomic on its first draw (once per thread),
/// then counts through its block in a thread-specific record.
enum ThreadSequence {
    private static let blocks = Atomic<UInt64>(0)
    private static let blockBits: UInt64 = 40

    /// The calling thread's counter: a heap cell freed when the thread ends.
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        precondition(pthread_key_create(&key, { free($0) }) == 0, "pthread_key_create failed")
        return key
    }()

    static func next() -> UInt64 {
        let cell: UnsafeMutablePointer<UInt64>
        if let raw = pthread_getspecific(key) {
            cell = raw.assumingMemoryBound(to: UInt64.self)
        } else {
            cell = malloc(MemoryLayout<UInt64>.size)!.bindMemory(to: UInt64.self, capacity: 1)
            cell.initialize(to: blocks.wrappingAdd(1, ordering: .relaxed).oldValue << blockBits)
            pthread_setspecific(key, cell)
        }
        cell.pointee &+= 1
        return cell.pointee
    }
}
