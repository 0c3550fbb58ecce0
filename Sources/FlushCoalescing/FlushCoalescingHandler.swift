import NIOCore

/// Between NIOHTTP2 and TLS on an HTTP/2 connection: the flushes asked for within one turn of
/// the event loop become one, run once the tasks queued before it have run. Each stream flushes
/// the connection as its request is written; when a read completes a batch of responses, the
/// next requests of those streams start in the same turn, and without this each would cost a TLS
/// record and a `write` of its own (perf: 10 % of HTTP/2's CPU per request was the connection's
/// flush). Reads already coalesce inside NIOHTTP2 (flushed at `channelReadComplete`). A close
/// flushes what is pending first, so nothing written before it is dropped.
///
/// Every method runs on the channel's event loop.
final class FlushCoalescingHandler: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = IOData
    typealias OutboundOut = IOData

    private var context: ChannelHandlerContext?
    private var flushPending = false

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        if flushPending {
            flushPending = false
            context.flush()
        }
        self.context = nil
    }

    func flush(context: ChannelHandlerContext) {
        guard !flushPending else { return }
        flushPending = true
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        context.eventLoop.execute { handler.value.flushNow() }
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if flushPending {
            flushPending = false
            context.flush()
        }
        context.close(mode: mode, promise: promise)
    }

    private func flushNow() {
        guard flushPending else { return }
        flushPending = false
        context?.flush()
    }
}
