// Makes Synchronization.Mutex visible to ThreadSanitizer on Linux (preloaded into the
// sanitized test process by scripts/sanitize; never part of the product).
//
// Mutex's fast paths (`_lock`/`_unlock`) are inlined into our instrumented code, but under
// contention it calls `_lockSlow`/`_unlockSlow` in libswiftSynchronization.so, which is not
// instrumented: it acquires the lock with a plain compare-exchange after spinning or has
// the kernel hand it over (FUTEX_LOCK_PI / FUTEX_UNLOCK_PI through `syscall`, which TSan
// does not model). TSan then sees no happens-before between two critical sections and
// reports every contended `withLock` as a race (reproduced with four threads incrementing
// a `Mutex<[Int: Int]>`; see bench/RESULTS.md, "Sanitizers"). These replacements keep the
// same protocol on the same futex word and tell TSan about the acquire and the release.
import Synchronization
// The stdlib's own helpers (thread id cache, futex calls): `syscall` is variadic, so Swift cannot call it.
import _SynchronizationShims

#if canImport(Glibc)
import Glibc
#endif

/// Same layout as `Synchronization._MutexHandle`: one `Atomic<UInt32>` holding 0 (unlocked)
/// or the owner's thread id, with FUTEX_WAITERS set when a waiter sleeps in the kernel.
public struct MutexHandleLayout: ~Copyable {
    let storage: Atomic<UInt32>
}

private typealias Annotation = @convention(c) (UnsafeMutableRawPointer?) -> Void

/// TSan's annotation entry points, exported by the sanitized executable.
private let tsanAcquire = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__tsan_acquire")
    .map { unsafeBitCast($0, to: Annotation.self) }
private let tsanRelease = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__tsan_release")
    .map { unsafeBitCast($0, to: Annotation.self) }

private let futexWaiters: UInt32 = 0x8000_0000

extension MutexHandleLayout {
    private var address: UnsafeMutableRawPointer {
        // `self` is passed indirectly (Atomic is address-only), and `storage` is at offset 0.
        UnsafeMutableRawPointer(mutating: withUnsafePointer(to: self) { UnsafeRawPointer($0) })
    }

    /// Replaces `_MutexHandle._lockSlow(_:)`: spin (yielding) on the compare-exchange until
    /// the word is 0, never parking in the kernel, so the unlock fast path always applies.
    @_silgen_name("$s15Synchronization12_MutexHandleV9_lockSlowyys6UInt32VF")
    public borrowing func lockSlow(_ selfId: UInt32) {
        while true {
            if storage.load(ordering: .relaxed) == 0,
               storage.compareExchange(expected: 0, desired: selfId, successOrdering: .acquiring,
                                       failureOrdering: .relaxed).exchanged {
                tsanAcquire?(address)
                return
            }
            sched_yield()
        }
    }

    /// Replaces `_MutexHandle._tryLockSlow()`: one more attempt, no kernel call.
    @_silgen_name("$s15Synchronization12_MutexHandleV12_tryLockSlowSbyF")
    public borrowing func tryLockSlow() -> Bool {
        let selfId = _swift_stdlib_gettid()
        guard storage.compareExchange(expected: 0, desired: selfId, successOrdering: .acquiring,
                                      failureOrdering: .relaxed).exchanged else { return false }
        tsanAcquire?(address)
        return true
    }

    /// Replaces `_MutexHandle._unlockSlow()`, reached only when FUTEX_WAITERS is set (a waiter
    /// parked by code not routed through `lockSlow` above): the kernel hands the lock over.
    @_silgen_name("$s15Synchronization12_MutexHandleV11_unlockSlowyyF")
    public borrowing func unlockSlow() {
        tsanRelease?(address)
        let selfId = _swift_stdlib_gettid()
        if storage.compareExchange(expected: selfId, desired: 0, successOrdering: .releasing,
                                   failureOrdering: .relaxed).exchanged { return }
        precondition(storage.load(ordering: .relaxed) & ~futexWaiters == selfId,
                     "unlock of a Mutex by a thread that does not hold it")
        var status: UInt32
        repeat {
            status = _swift_stdlib_futex_unlock(address.assumingMemoryBound(to: UInt32.self))
        } while status == UInt32(EINTR)
        precondition(status == 0, "FUTEX_UNLOCK_PI failed: errno \(status)")
    }
}
