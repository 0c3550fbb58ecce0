import LockAudit

/// Every `Mutex` in this module is an `AuditedMutex` (it shadows `Synchronization.Mutex`), so the
/// confinement test can see which threads take each lock (issue #33). Off, it costs one relaxed load.
typealias Mutex = AuditedMutex
