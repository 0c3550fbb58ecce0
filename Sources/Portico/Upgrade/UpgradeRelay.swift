import NIOCore

/// How an upgraded session ended: the access log's `ended` and the metrics' `reason` label.
public enum UpgradeEndReason: String, Sendable, CaseIterable {
    /// The client closed or reset its connection (or it failed).
    case clientClosed = "client_closed"
    /// The upstream closed or reset its connection (or it failed).
    case upstreamClosed = "upstream_closed"
    /// No byte either way for the route's `websocket_idle_timeout`.
    case idleTimeout = "idle_timeout"
    /// The gateway stopped (SIGTERM) and the grace period was over.
    case drained
}

/// What one session carried, when it is over.
public struct UpgradeSummary: Sendable {
    /// Bytes from the client to the upstream (after the handshake), and back.
    public var bytesFromClient: Int
    public var bytesFromUpstream: Int
    /// From the 101 to the end.
    public var duration: Duration
    public var reason: UpgradeEndReason
}

/// One side of an upgraded session's byte relay: the client's connection or the upstream's,
/// each glued to the other on the same event loop. Bytes read on one side are written to the
/// other as they come; a side reads only while the other can take writes (NIO's writability,
/// its high and low water marks), so a slow reader on either side slows the other and nothing
/// is buffered without bound. Every method runs on the channel's event loop.
final class RelayHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    enum Side: Sendable { case client, upstream }

    let side: Side
    private var context: ChannelHandlerContext?
    private var partner: RelayHandler?
    private var session: UpgradeSession?
    /// A read the channel asked for while the partner could not take more (or was not there yet).
    private var readPending = false
    /// Read before the session joined the two sides: reads are held meanwhile, so this is at most
    /// what one read brought, plus what the HTTP decoder had past the 101 head.
    private var held: [ByteBuffer] = []
    /// Bytes read from this side.
    private(set) var bytesRead = 0
    /// Frames read from this side (toward the partner): where a close frame may go in.
    private(set) var frames = WebSocketFrameTracker()
    private(set) var isClosed = false
    /// Where the session's ending with close frames (`finishFrame`) stands for this side.
    private enum Ending {
        /// Relaying as usual.
        case no
        /// Bytes pass only until the frame in progress toward the partner is whole; then
        /// `settled` runs, once.
        case finishingFrame(settled: () -> Void)
        /// Between two frames and ending: nothing more is read.
        case settled
    }
    private var ending = Ending.no

    init(side: Side) {
        self.side = side
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        // The channel is gone: the references to the partner and the session go too (the session
        // keeps both handlers, for its summary; they must not keep it).
        self.context = nil
        partner = nil
        session = nil
        held = []
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = unwrapInboundIn(data)
        switch ending {
        case .no:
            break
        case .finishingFrame(let settled):
            // Only the rest of the frame in progress goes on; what follows it is dropped.
            let frameBytes = frames.consumeToBoundary(buffer)
            bytesRead += frameBytes
            if frameBytes > 0, let slice = buffer.readSlice(length: frameBytes) {
                session?.activity()
                partner?.write(slice)
                partner?.flush()
            }
            if frames.atBoundary {
                ending = .settled
                settled()
            }
            return
        case .settled:
            return
        }
        bytesRead += buffer.readableBytes
        frames.consume(buffer)
        guard let partner else {
            held.append(buffer)
            return
        }
        session?.activity()
        partner.write(buffer)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        partner?.flush()
        context.fireChannelReadComplete()
    }

    func read(context: ChannelHandlerContext) {
        if case .settled = ending {
            readPending = true
            return
        }
        if let partner, partner.isWritable {
            context.read()
        } else {
            readPending = true
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { partner?.resumeReads() }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        isClosed = true
        if case .finishingFrame(let settled) = ending {
            // Gone mid-frame: nothing more to wait for from this side.
            ending = .settled
            settled()
        }
        session?.sideClosed(side)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A reset or a TLS failure: the side is gone (`channelInactive` follows).
        context.close(promise: nil)
    }

    // MARK: Driven by the partner and the session

    fileprivate var isWritable: Bool { context?.channel.isWritable ?? false }

    fileprivate func write(_ buffer: ByteBuffer) {
        guard let context, !isClosed else { return }
        context.write(wrapOutboundOut(buffer), promise: nil)
    }

    fileprivate func flush() {
        context?.flush()
    }

    fileprivate func resumeReads() {
        guard readPending, let context else { return }
        readPending = false
        context.read()
    }

    /// Joins this side to `partner`: what was held goes first, then reads start.
    func join(_ partner: RelayHandler, session: UpgradeSession) {
        self.partner = partner
        self.session = session
        for buffer in held { partner.write(buffer) }
        held = []
        partner.flush()
        if isClosed {
            session.sideClosed(side)
            return
        }
        // A read held before the join (by this handler or one removed since) is asked for again.
        readPending = false
        context?.read()
    }

    /// The session is ending with close frames: this side's frame in progress toward the
    /// partner is relayed to its end (nothing after it), then `settled` runs — at once when
    /// between two frames or closed already, else when the frame is whole or this side closes.
    func finishFrame(then settled: @escaping () -> Void) {
        guard !frames.atBoundary, !isClosed else {
            ending = .settled
            settled()
            return
        }
        ending = .finishingFrame(settled: settled)
        resumeReads()
    }

    /// Writes `frame` (if any) after everything already queued, then closes once it is out.
    func close(after frame: ByteBuffer?) {
        guard let context else { return }
        if isClosed {
            context.close(promise: nil)
            return
        }
        if let frame { context.write(wrapOutboundOut(frame), promise: nil) }
        let flushed = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(wrapOutboundOut(ByteBuffer()), promise: flushed)
        let channel = context.channel
        flushed.futureResult.whenComplete { _ in channel.close(promise: nil) }
    }

    var channel: (any Channel)? { context?.channel }
}
