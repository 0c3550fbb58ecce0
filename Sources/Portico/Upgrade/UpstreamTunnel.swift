import NIOCore
import Synchronization

/// The upstream connection that answered `101 Switching Protocols`: out of its pool for good
/// (`HTTP1ConnectionPool` detaches it), its HTTP codecs removed, its bytes held by a
/// `RelayHandler` until the client's side joins (`UpgradeSession`). Made on the connection's
/// event loop; what it carries to the gateway is the channel and its relay handler.
public final class UpstreamTunnel: Sendable {
    let channel: any Channel
    /// The upstream side's relay handler, touched only on `channel.eventLoop`.
    let relay: NIOLoopBound<RelayHandler>
    /// Told the session's summary when it ends (the access log's line, tracing's span). Appended
    /// to by the chain's task and read once at the end, both on the channel's loop; a lock
    /// only one thread takes.
    private let observers = Mutex<[@Sendable (UpgradeSummary) -> Void]>([])

    init(channel: any Channel, relay: RelayHandler) {
        self.channel = channel
        self.relay = NIOLoopBound(relay, eventLoop: channel.eventLoop)
    }

    public var eventLoop: any EventLoop { channel.eventLoop }

    /// `observer` hears how the session went, once, when it ends.
    public func onEnd(_ observer: @escaping @Sendable (UpgradeSummary) -> Void) {
        observers.withLock { $0.append(observer) }
    }

    func ended(_ summary: UpgradeSummary) {
        let all = observers.withLock { observers in
            defer { observers = [] }
            return observers
        }
        for observer in all { observer(summary) }
    }

    /// The session never started (the 101 did not reach the client): the upstream is closed.
    func abandon() {
        channel.close(promise: nil)
    }
}
