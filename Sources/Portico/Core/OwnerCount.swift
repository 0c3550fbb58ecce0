import Synchronization

/// How many holders share a resource that is closed by the last one to let go: a reload's new
/// runtime taking over an unchanged credential provider or store client from the old one.
/// Starts at one owner; once it has dropped to zero it never rises again.
final class OwnerCount: Sendable {
    private let owners = Mutex(1)

    /// Takes a share, unless the resource has been closed already.
    func retain() -> Bool {
        owners.withLock { count in
            guard count > 0 else { return false }
            count += 1
            return true
        }
    }

    /// Gives a share back; `true` for the last one (the caller closes the resource).
    func release() -> Bool {
        owners.withLock { count in
            guard count > 0 else { return false }
            count -= 1
            return count == 0
        }
    }
}
