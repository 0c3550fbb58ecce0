import FlushCoalescing
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import NIOTLS
import Synchronization

/// One HTTP/2 connection of an `HTTP2ConnectionPool`: a channel whose pipeline is, for TLS,
/// `NIOSSLClientHandler` (+ the `PeerCertificateCheckHandler`s, as on HTTP/1.1), a
/// `FlushCoalescingHandler` (the streams' flushes of one loop turn as one), then NIOHTTP2's
/// `NIOHTTP2Handler` in its frame mode (frames tagged with stream ids, no stream channels), an
/// `HTTP2StreamsHandler` that runs the exchanges, and an `HTTP2ConnectionHandler` that hears
/// the connection's own frames (SETTINGS, GOAWAY, PING). Over TLS the HTTP/2 handlers are
/// added once ALPN has chosen `h2`; cleartext is prior knowledge (h2c), from the first byte.
///
/// **A stream per request**, as a row of `HTTP2StreamsHandler`'s table: the HTTP/1.1 exchange's
/// machine drives it, so streaming both ways, the relay's backpressure (a stream's window stays
/// shut while its reader is behind, the other streams flow) and the deadline are the HTTP/1.1
/// exchange's, unchanged. A stream ended before its end is reset with `RST_STREAM(CANCEL)`,
/// and the connection is left to the others.
///
/// The head is mapped as NIOHTTP2's HTTP/1 codec did: `Host` becomes `:authority`, names are
/// lower-cased, and the connection-specific fields (`Connection` and what it names,
/// `Keep-Alive`, `Proxy-Connection`, `Transfer-Encoding`, `Upgrade`) are dropped; `TE` never
/// reaches it (`ForwardingHeaders`).
struct HTTP2Connection: Sendable {
    /// What the pool hears of a connection, on its loop.
    struct Events: Sendable {
        /// The peer's `SETTINGS_MAX_CONCURRENT_STREAMS` changed (`nil`: its first SETTINGS set
        /// none, so no limit; later ones without it change nothing and are not told).
        var settings: @Sendable (Int?) -> Void
        /// `GOAWAY`: no new streams; those below its last stream id finish.
        var goAway: @Sendable () -> Void
    }

    let channel: any Channel
    /// Set once the connection speaks HTTP/2 (ALPN chose h2, or prior knowledge): its streams.
    let streams: NIOLoopBoundBox<HTTP2StreamsHandler?>
    /// The peer's stream limit when the connection became ready (`nil`: no limit): its first
    /// SETTINGS' `SETTINGS_MAX_CONCURRENT_STREAMS` in cleartext, `assumedPeerStreams` over TLS
    /// (ready before the SETTINGS came: `HTTP2ConnectionHandler`).
    let initialMaxStreams: Int?
    /// Why the connection was ended under its streams, when the upstream broke the protocol
    /// (`HTTP2ConnectionHandler`): what those streams' callers hear, rather than the CANCEL
    /// their close carries (which would send an idempotent request again, to the same peer).
    let failure: Failure

    /// Written once, on the connection's loop, read by the streams' callers wherever they are.
    final class Failure: Sendable {
        private let value = Mutex<UpstreamError?>(nil)

        func record(_ failure: UpstreamError) {
            value.withLock { $0 = $0 ?? failure }
        }

        var recorded: UpstreamError? { value.withLock { $0 } }
    }

    /// Our SETTINGS: no push and no streams opened by the server (`max_concurrent_streams`
    /// bounds the streams we open, which the pool counts, not a setting); a stream window that
    /// bounds what one slow stream can hold (`streamWindow`); a bounded header list (header
    /// floods stop at the decoder).
    static let settings: HTTP2Settings = [
        HTTP2Setting(parameter: .enablePush, value: 0),
        HTTP2Setting(parameter: .maxConcurrentStreams, value: 0),
        HTTP2Setting(parameter: .initialWindowSize, value: streamWindow),
        HTTP2Setting(parameter: .maxHeaderListSize, value: maxHeaderListSize),
    ]

    /// What one stream may have in flight towards Portico before it reads: with the relay's
    /// own watermark, the memory a slow client's stream costs, whatever the body's size.
    static let streamWindow = 256 * 1024
    /// The connection's window: room for several streams at full speed at once, and the bound on
    /// what all the connection's streams together may have in flight towards Portico. Sent as a
    /// WINDOW_UPDATE right after our SETTINGS.
    static let connectionWindow = 4 * 1024 * 1024
    /// Every window's size before SETTINGS or WINDOW_UPDATE change it (RFC 9113 §6.9.2).
    static let defaultWindow = 65_535
    static let maxHeaderListSize = 64 * 1024
    /// The peer's stream limit until its SETTINGS say: RFC 9113 §6.5.2's recommended least, and
    /// NIOHTTP2's own assumption for the streams it lets out meanwhile.
    static let assumedPeerStreams = 100

    /// NIOHTTP2's limits on what a hostile upstream can make Portico hold or do, set here
    /// rather than left to the library's defaults (each is tested against a flooding server in
    /// HTTP2HostileUpstreamTests). Each one exceeded is a connection error: NIOHTTP2 sends
    /// GOAWAY and `HTTP2ConnectionHandler` closes the connection.
    static func connectionConfiguration() -> NIOHTTP2Handler.ConnectionConfiguration {
        var connection = NIOHTTP2Handler.ConnectionConfiguration()
        connection.initialSettings = settings
        connection.targetWindowSize = connectionWindow
        // Malformed header blocks and a Content-Length the DATA frames contradict are errors.
        connection.headerBlockValidation = .enabled
        connection.contentLengthValidation = .enabled
        // A header block (HEADERS + CONTINUATION) is bounded twice: its bytes by
        // `maxHeaderListSize` (our SETTINGS_MAX_HEADER_LIST_SIZE, also the decoded list's
        // bound), its frames by this (CONTINUATION floods of tiny frames).
        connection.maximumSequentialContinuationFrames = 5
        // Empty DATA frames carry nothing: a run of them is a flood.
        connection.maximumSequentialEmptyDataFrames = 1
        // PING, SETTINGS, PRIORITY frames (each PING and SETTINGS wants an answer): at most 200
        // in 30 s; and at most 1000 answers queued when the peer does not read them.
        connection.controlFrameRateLimit.maximumCount = 200
        connection.controlFrameRateLimit.windowLength = .seconds(30)
        connection.maximumBufferedControlFrames = 1000
        // Streams reset by us kept to ignore their late frames: a bounded table.
        connection.maximumRecentlyResetStreams = 32
        return connection
    }

    static func streamConfiguration() -> NIOHTTP2Handler.StreamConfiguration {
        var stream = NIOHTTP2Handler.StreamConfiguration()
        stream.targetWindowSize = streamWindow
        // RST_STREAM from the peer (a reset flood), and stream errors it causes: 200 in 30 s.
        stream.streamResetFrameRateLimit.maximumCount = 200
        stream.streamResetFrameRateLimit.windowLength = .seconds(30)
        stream.streamErrorRateLimit.maximumCount = 200
        stream.streamErrorRateLimit.windowLength = .seconds(30)
        return stream
    }

    /// Connects and, with TLS, completes the handshake (ALPN must choose `h2`, else
    /// `HTTP2Unavailable`); in cleartext, waits for the peer's SETTINGS; all within `timeout`.
    static func connect(to endpoint: HTTP1Connection.Endpoint, on loop: any EventLoop, configuration: HTTP2Config,
                        timeout: TimeAmount, failure timeoutFailure: UpstreamError,
                        events: Events) async throws -> HTTP2Connection {
        let ready = loop.makePromise(of: Int?.self)
        let failure = Failure()
        let box = NIOLoopBoundBox<HTTP2StreamsHandler?>.makeEmptyBox(valueType: HTTP2StreamsHandler.self, eventLoop: loop)
        let bootstrap = ClientBootstrap(group: loop)
            .connectTimeout(timeout)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let pipeline = channel.pipeline.syncOperations
                    try endpoint.addTLSHandlers(to: pipeline)
                    // NIOHTTP2's handler goes in after this one (before `HTTP2ConnectionHandler`).
                    try pipeline.addHandler(FlushCoalescingHandler())
                    let handler = HTTP2ConnectionHandler(ready: ready, configuration: configuration, events: events,
                                                         streams: box, failure: failure, isTLS: endpoint.tls != nil)
                    try pipeline.addHandler(handler)
                    handler.limitStart(to: timeout, failure: timeoutFailure, on: channel.eventLoop)
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            let failure = HTTP1Connection.connectFailure(error, timeout: timeoutFailure)
            ready.fail(failure)
            throw failure
        }
        let maxStreams: Int?
        do {
            maxStreams = try await withTaskCancellationHandler {
                try await ready.futureResult.get()
            } onCancel: {
                channel.close(promise: nil)
            }
        } catch {
            channel.close(promise: nil)
            throw error
        }
        return HTTP2Connection(channel: channel, streams: box, initialMaxStreams: maxStreams, failure: failure)
    }

    /// One exchange on a new stream of this connection (`HTTP2StreamsHandler`): returns the
    /// response (with a streamed body, at its head). `onClose` runs on the connection's loop once
    /// the stream has ended, whatever ended it (also when it never opened). Cancelling the task
    /// resets the stream (`RST_STREAM(CANCEL)`); the connection carries on. A streamed request
    /// body is written part by part after the head, each part awaited until the stream's window
    /// took it; if one fails, the stream is reset.
    nonisolated(nonsending) func execute(_ exchange: HTTP1Exchange, onClose: @escaping @Sendable () -> Void) async throws -> HTTP1Response {
        let eventLoop = channel.eventLoop
        let streams = self.streams
        let stream = NIOLoopBoundBox<HTTP2StreamsHandler.Stream?>.makeEmptyBox(valueType: HTTP2StreamsHandler.Stream.self,
                                                                               eventLoop: eventLoop)
        let cancel: @Sendable () -> Void = {
            eventLoop.execute {
                if let handler = streams.value, let open = stream.value { handler.cancel(open) }
            }
        }
        guard let upload = exchange.upload else {
            // One suspension: the stream opens at once when this task runs on the connection's
            // loop (the pool's does), and the response resumes the task there.
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    onLoop { Self.open(exchange, on: streams, into: stream, onClose: onClose) { continuation.resume(with: $0) } }
                }
            } onCancel: {
                cancel()
            }
        }
        return try await withTaskCancellationHandler {
            let (sent, response) = try await eventLoop.submit {
                let promise = eventLoop.makePromise(of: HTTP1Response.self)
                return (Self.open(exchange, on: streams, into: stream, onClose: onClose, complete: promise.completeWith),
                        promise.futureResult)
            }.get()
            // Refused: the body stays unread, so the request can still go out on another connection.
            guard sent else { return try await response.get() }
            // After the head was queued on the event loop, so the parts follow it.
            Task {
                do {
                    try await upload.run { chunk in
                        try await Self.write(chunk, on: streams, stream: stream, eventLoop: eventLoop)
                    }
                    try await Self.write(nil, on: streams, stream: stream, eventLoop: eventLoop)
                } catch {
                    cancel()
                }
            }
            return try await response.get()
        } onCancel: {
            cancel()
        }
    }

    /// Opens the stream, on the loop. `true`: the request went out.
    @discardableResult
    private static func open(_ exchange: HTTP1Exchange, on streams: NIOLoopBoundBox<HTTP2StreamsHandler?>,
                             into stream: NIOLoopBoundBox<HTTP2StreamsHandler.Stream?>, onClose: @escaping @Sendable () -> Void,
                             complete: @escaping HTTP1ExchangeHandler.Completion) -> Bool {
        guard let handler = streams.value else {
            onClose()
            complete(.failure(HTTP2StreamRefused(failure: .connectionClosed("the HTTP/2 connection closed"))))
            return false
        }
        return handler.open(exchange, box: stream, onClose: onClose, complete: complete)
    }

    /// A part of a streamed request body (`nil`: its end), once the stream's window took it.
    private static func write(_ part: ByteBuffer?, on streams: NIOLoopBoundBox<HTTP2StreamsHandler?>,
                              stream: NIOLoopBoundBox<HTTP2StreamsHandler.Stream?>, eventLoop: any EventLoop) async throws {
        try await eventLoop.flatSubmit {
            if let handler = streams.value, let open = stream.value, let written = handler.write(part, on: open) { return written }
            return eventLoop.makeFailedFuture(UpstreamError.connectionClosed("the HTTP/2 stream ended"))
        }.get()
    }

    var isActive: Bool { channel.isActive }

    /// Closes the connection (its open streams fail) after telling the upstream with
    /// `GOAWAY(NO_ERROR)`. The pool closes a draining connection only once its last stream has
    /// ended, so a reload lets streams finish.
    func close() {
        let channel = self.channel
        let streams = self.streams
        let failure = self.failure
        onLoop {
            // A connection the upstream broke has had NIOHTTP2's GOAWAY (with the error's code).
            guard streams.value != nil, channel.isActive, failure.recorded == nil else {
                channel.close(promise: nil)
                return
            }
            // A peer that reads nothing would hold the write (and the close) for ever.
            let backstop = channel.eventLoop.scheduleTask(in: Self.goAwayWriteLimit) { channel.close(promise: nil) }
            channel.writeAndFlush(Self.goAwayFrame).whenComplete { _ in
                backstop.cancel()
                channel.close(promise: nil)
            }
        }
    }

    /// Tells the upstream `GOAWAY(NO_ERROR)` and leaves the connection open for the streams in
    /// flight (a reload or a drain retiring it; the pool closes it at its last stream's end).
    func goAway() {
        let channel = self.channel
        let streams = self.streams
        onLoop {
            guard streams.value != nil, channel.isActive else { return }
            channel.writeAndFlush(Self.goAwayFrame, promise: nil)
        }
    }

    /// Last stream id 0: Portico accepts no stream from the server (no push), so none was processed.
    static let goAwayFrame = HTTP2Frame(streamID: .rootStream,
                                        payload: .goAway(lastStreamID: .rootStream, errorCode: .noError, opaqueData: nil))
    static let goAwayWriteLimit = TimeAmount.seconds(1)

    private func onLoop(_ body: @escaping @Sendable () -> Void) {
        if channel.eventLoop.inEventLoop { body() } else { channel.eventLoop.execute(body) }
    }
}

/// A stream the upstream refused before it reached its application — `REFUSED_STREAM`, or
/// above a `GOAWAY`'s last stream id, or opened on a connection going away — so the request can
/// go out once more, on another connection, whatever its method (RFC 9113 §8.7).
struct HTTP2StreamRefused: Error, Sendable {
    /// What the caller hears if it is not sent again.
    var failure: UpstreamError

    /// The refusal in one of NIOHTTP2's errors, if it is one.
    static func from(_ error: any Error) -> HTTP2StreamRefused? {
        switch error {
        case let refused as HTTP2StreamRefused:
            return refused
        case let closed as NIOHTTP2Errors.StreamClosed where closed.errorCode == .refusedStream:
            return HTTP2StreamRefused(failure: .connectionClosed("the upstream refused the stream (REFUSED_STREAM or GOAWAY)"))
        case is NIOHTTP2Errors.CreatedStreamAfterGoaway, is NIOHTTP2Errors.NoStreamIDAvailable:
            return HTTP2StreamRefused(failure: .connectionClosed("the HTTP/2 connection is going away"))
        default:
            return nil
        }
    }
}

/// The connection ended under a stream before any byte of its response (NIOHTTP2 closes the
/// open streams with CANCEL when the connection goes): the request may have been read, so only
/// one that may go out twice (`HTTP1Exchange.resendableAfterWrite`) is sent again — the race of
/// a GOAWAY lost in a reset, or a server closing as the stream went out, as on HTTP/1.1's
/// `StaleConnection`.
struct HTTP2ConnectionLost: Error, Sendable {
    var failure: UpstreamError
}

extension HTTP2ErrorCode {
    /// RFC 9113's name for the code.
    var name: String {
        switch self {
        case .noError: "NO_ERROR"
        case .protocolError: "PROTOCOL_ERROR"
        case .internalError: "INTERNAL_ERROR"
        case .flowControlError: "FLOW_CONTROL_ERROR"
        case .settingsTimeout: "SETTINGS_TIMEOUT"
        case .streamClosed: "STREAM_CLOSED"
        case .frameSizeError: "FRAME_SIZE_ERROR"
        case .refusedStream: "REFUSED_STREAM"
        case .cancel: "CANCEL"
        case .compressionError: "COMPRESSION_ERROR"
        case .connectError: "CONNECT_ERROR"
        case .enhanceYourCalm: "ENHANCE_YOUR_CALM"
        case .inadequateSecurity: "INADEQUATE_SECURITY"
        case .http11Required: "HTTP_1_1_REQUIRED"
        default: "error code \(networkCode)"
        }
    }
}

/// ALPN did not choose `h2`: with `protocol: auto` the upstream is spoken to on HTTP/1.1.
struct HTTP2Unavailable: Error, Sendable, Equatable {
    /// What ALPN chose instead (`nil`: nothing).
    var negotiated: String?

    var failure: UpstreamError {
        .protocolError("the upstream did not choose h2 by ALPN (it chose \(negotiated ?? "nothing"))")
    }
}
