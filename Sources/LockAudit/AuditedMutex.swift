import Synchronization

/// `Synchronization.Mutex` with a switchable record of which threads take each instance.
///
/// Portico's modules on the request path name it `Mutex` (a module-level typealias shadows the
/// standard one), so every lock they take can be audited: `LockAudit.start()` turns recording on
/// and `LockAudit.report()` says, per lock instance and per creation site, which threads took it
/// and how often. The confinement test (issue #33) proxies thousands of requests with it on and
/// checks that no lock taken per request is taken by more than one thread.
///
/// Off (the default, and always in production) it costs one relaxed load of a flag that is never
/// written while serving: no shared cache line is written.
public struct AuditedMutex<Value: ~Copyable>: ~Copyable {
    @usableFromInline let mutex: Synchronization.Mutex<Value>
    /// 0 unless created while the audit was on.
    @usableFromInline let id: Int

    public init(_ initialValue: consuming sending Value, fileID: StaticString = #fileID, line: UInt = #line) {
        mutex = Synchronization.Mutex(initialValue)
        id = LockAudit.isRecording ? LockAudit.register(site: LockAudit.Site(fileID: fileID, line: line)) : 0
    }

    @inlinable
    public borrowing func withLock<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result {
        if id != 0 && LockAudit.isRecording { LockAudit.taken(id) }
        return try mutex.withLock(body)
    }

    @inlinable
    public borrowing func withLockIfAvailable<Result: ~Copyable, E: Error>(
        _ body: (inout sending Value) throws(E) -> sending Result
    ) throws(E) -> sending Result? {
        if id != 0 && LockAudit.isRecording { LockAudit.taken(id) }
        return try mutex.withLockIfAvailable(body)
    }
}

extension AuditedMutex: Sendable where Value: ~Copyable {}
