import CMicroHTTPD
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// What a client leaving ends: a request waiting for its handler, a response stream.
protocol HangUpListener: AnyObject, Sendable {
    /// The client left: end the work and shut `timer`'s socket down. Returns whether the work
    /// was still going (counted as a hang-up).
    func clientLeft(timer: ConnectionTimer) -> Bool
    /// Whether it is over already.
    var isOver: Bool { get }
}

/// Notices clients that leave while their request is suspended.
///
/// Why: libmicrohttpd does not poll a suspended connection, so a client that closes or resets
/// it is not seen until the handler answers, and the handler's work (an upstream request) runs
/// to its end for nobody. While a request is suspended, its connection's descriptor (the
/// duplicate `ConnectionTimer` holds) is in this epoll set, for the peer going away only:
/// EPOLLRDHUP (it closed its sending side), EPOLLHUP, EPOLLERR, never plain readability (a
/// pipelined next request is no hang-up). The deadline watchdog collects the hang-ups each
/// tick; the server cancels their work and closes their connections. Costs one `epoll_ctl` to
/// add and one to remove per suspended request.
final class HangUpWatch: Sendable {
    /// The epoll instance (-1 when none could be made: hang-ups are then noticed when answering).
    let descriptor: Int32

    private struct Watched {
        let listener: any HangUpListener
        let timer: ConnectionTimer
    }

    /// Suspended requests by their token (the epoll event's data).
    private let watched = Mutex<(next: UInt64, byToken: [UInt64: Watched], tokens: [ObjectIdentifier: UInt64])>(
        (1, [:], [:]))

    init() {
        descriptor = epoll_create1(Int32(EPOLL_CLOEXEC))
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
    }

    /// Watches `listener`'s connection (through `timer`'s descriptor) until `unwatch`.
    func watch(_ listener: any HangUpListener, on timer: ConnectionTimer) {
        guard descriptor >= 0 else { return }
        let token = watched.withLock { watched -> UInt64 in
            let token = watched.next
            watched.next += 1
            watched.byToken[token] = Watched(listener: listener, timer: timer)
            watched.tokens[ObjectIdentifier(listener)] = token
            return token
        }
        timer.watchHangUp(in: self, token: token)
        // Over already (answered by the deadline watchdog or `stop`): its `unwatch` may have come first.
        if listener.isOver { unwatch(listener, on: timer) }
    }

    /// Stops watching `listener`'s connection; idempotent. Called when it is over, before its
    /// connection can be closed (so before its descriptor is).
    func unwatch(_ listener: any HangUpListener, on timer: ConnectionTimer) {
        guard descriptor >= 0 else { return }
        watched.withLock { watched in
            if let token = watched.tokens.removeValue(forKey: ObjectIdentifier(listener)) {
                watched.byToken.removeValue(forKey: token)
            }
        }
        timer.unwatchHangUp()
    }

    /// The watched exchanges whose clients have left since the last call. Does not wait.
    func departed() -> [(listener: any HangUpListener, timer: ConnectionTimer)] {
        guard descriptor >= 0 else { return [] }
        var found: [(listener: any HangUpListener, timer: ConnectionTimer)] = []
        var events = [epoll_event](repeating: epoll_event(), count: 64)
        while true {
            let count = epoll_wait(descriptor, &events, Int32(events.count), 0)
            guard count > 0 else { break }
            watched.withLock { watched in
                for event in events[0..<Int(count)] {
                    if let entry = watched.byToken[event.data.u64] { found.append((entry.listener, entry.timer)) }
                }
            }
            // Each registration is one-shot: a full batch means there may be more.
            if Int(count) < events.count { break }
        }
        return found
    }

    /// The events that mean the peer went away, one-shot.
    static let events = EPOLLRDHUP.rawValue | EPOLLHUP.rawValue | EPOLLERR.rawValue | EPOLLONESHOT.rawValue
}
