import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Records, while switched on, which threads take each audited lock (`AuditedMutex`) and which
/// threads touch each shared counter (`SharedCap`). Used by tests only; recording is per thread
/// (a thread-specific record), so the audit itself adds no shared lock to the path it measures.
public enum LockAudit {
    /// Where a lock was created.
    public struct Site: Hashable, Sendable, CustomStringConvertible {
        public var file: String
        public var line: UInt
        public init(fileID: StaticString, line: UInt) {
            self.file = fileID.description
            self.line = line
        }
        public init(name: String) {
            self.file = name
            self.line = 0
        }
        public var description: String { line == 0 ? file : "\(file):\(line)" }
    }

    /// One lock instance (or shared counter) and the threads that took it.
    public struct Instance: Sendable {
        public var site: Site
        /// Acquisitions by thread.
        public var threads: [UInt: Int]
        public var acquisitions: Int { threads.values.reduce(0, +) }
    }

    @usableFromInline static let recording = Atomic<Bool>(false)
    private static let registry = Synchronization.Mutex(Registry())

    private struct Registry {
        var nextID = 1
        var sites: [Int: Site] = [:]
        var records: [ThreadRecord] = []
    }

    @inlinable
    public static var isRecording: Bool { recording.load(ordering: .relaxed) }

    /// Starts a fresh audit: locks created from now on are tracked.
    public static func start() {
        registry.withLock { registry in
            for record in registry.records { record.counts.withLock { $0.removeAll() } }
        }
        recording.store(true, ordering: .sequentiallyConsistent)
    }

    /// Stops recording (locks keep their ids; a later `start` counts afresh).
    public static func stop() {
        recording.store(false, ordering: .sequentiallyConsistent)
    }

    /// Runs `body` with recording on, for tests that run beside each other: the first to enter
    /// starts a fresh audit and the last to leave stops it, so one test's `stop` never ends
    /// another's recording. Each test tells its own locks apart by the threads that took them.
    public static func whileRecording<Result>(_ body: () throws -> Result) rethrows -> Result {
        sessions.withLock { count in
            if count == 0 { start() }
            count += 1
        }
        defer {
            sessions.withLock { count in
                count -= 1
                if count == 0 { stop() }
            }
        }
        return try body()
    }

    /// Tests inside `whileRecording` now.
    private static let sessions = Synchronization.Mutex(0)

    /// Every tracked instance taken since `start`.
    public static func report() -> [Instance] {
        registry.withLock { registry -> [Instance] in
            var instances: [Int: Instance] = [:]
            for record in registry.records {
                let counts = record.counts.withLock { $0 }
                for (id, count) in counts {
                    let site = registry.sites[id] ?? Site(name: "unknown")
                    instances[id, default: Instance(site: site, threads: [:])].threads[record.thread, default: 0] += count
                }
            }
            return Array(instances.values)
        }
    }

    public static func register(site: Site) -> Int {
        registry.withLock { registry in
            defer { registry.nextID += 1 }
            registry.sites[registry.nextID] = site
            return registry.nextID
        }
    }

    @usableFromInline
    static func taken(_ id: Int) {
        ThreadRecord.current.counts.withLock { $0[id, default: 0] += 1 }
    }

    /// The calling thread as the audit names it (the keys of `Instance.threads`): a number no
    /// other thread of this process ever had. `pthread_self()` values are reused once a thread
    /// exits, so a test that named its threads by them could count a dead thread's locks (another
    /// test's) as its own.
    public static var currentThread: UInt { ThreadRecord.current.thread }

    private static let nextThread = Atomic<UInt>(1)

    /// The calling thread's counts, made on its first audited acquisition.
    final class ThreadRecord: Sendable {
        let thread: UInt
        let counts = Synchronization.Mutex<[Int: Int]>([:])

        init(thread: UInt) { self.thread = thread }

        static var current: ThreadRecord {
            if let raw = pthread_getspecific(key) {
                return Unmanaged<ThreadRecord>.fromOpaque(raw).takeUnretainedValue()
            }
            let record = ThreadRecord(thread: nextThread.wrappingAdd(1, ordering: .relaxed).oldValue)
            // Retained for the life of the process: the report reads it after the thread is gone.
            pthread_setspecific(key, Unmanaged.passRetained(record).toOpaque())
            registry.withLock { $0.records.append(record) }
            return record
        }

        private static let key: pthread_key_t = {
            var key = pthread_key_t()
            precondition(pthread_key_create(&key, nil) == 0, "pthread_key_create failed")
            return key
        }()
    }
}

extension LockAudit {
    /// The report as JSON: one object per instance (`site`, `acquisitions`, `threads`: thread → count).
    public static func reportJSON() -> String {
        func escaped(_ text: String) -> String {
            var out = ""
            for character in text {
                if character == "\\" || character == "\"" { out.append("\\") }
                out.append(character)
            }
            return out
        }
        let rows = report().map { instance in
            let threads = instance.threads.map { "\"\($0.key)\":\($0.value)" }.joined(separator: ",")
            return "{\"site\":\"\(escaped(instance.site.description))\",\"acquisitions\":\(instance.acquisitions),\"threads\":{\(threads)}}"
        }
        return "[" + rows.joined(separator: ",\n") + "]\n"
    }
}
