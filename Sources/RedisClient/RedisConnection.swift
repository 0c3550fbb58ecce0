import FlushCoalescing
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// The first failure a connection's handler saw, readable once the channel (and the handler with
/// it) is gone: a TLS handshake that fails before the greeting is written closes the channel, and
/// the greeting's write then only says the channel is closed — the handshake is what to report.
final class ConnectionFailure: Sendable {
    private let first = Mutex<RedisError?>(nil)

    func record(_ error: RedisError) {
        first.withLock { if $0 == nil { $0 = error } }
    }

    var error: RedisError? { first.withLock { $0 } }
}

/// One command on its way: its encoded bytes and the promise its reply completes.
struct RedisRequest: Sendable {
    var bytes: ByteBuffer
    var promise: EventLoopPromise<RESPValue>
}

/// A reply awaited by a task on the connection's own event loop: resumed straight from the
/// handler that parsed it, or by its deadline, whichever comes first — no promise, future or
/// scheduled task between (a request's command on the shared Redis paid three of each).
/// Confined to that loop: made, armed, completed and timed out there.
final class RedisReplyWaiter: NIOScheduledCallbackHandler {
    private var continuation: UnsafeContinuation<RESPValue, any Error>?
    private var timer: NIOScheduledCallback?
    private let timeoutMessage: String

    init(_ continuation: UnsafeContinuation<RESPValue, any Error>, timeoutMessage: String) {
        self.continuation = continuation
        self.timeoutMessage = timeoutMessage
    }

    /// Fails the wait at `deadline` unless the reply came first. `false`: the loop is shutting
    /// down, and the wait has failed already (the command is not to be sent).
    func arm(_ deadline: NIODeadline, on eventLoop: any EventLoop) -> Bool {
        do {
            timer = try eventLoop.assumeIsolated().scheduleCallback(at: deadline, handler: self)
            return true
        } catch {
            complete(.failure(RedisError(.shutdown, "the event loop is shutting down")))
            return false
        }
    }

    /// Resumes the task once; later calls (a reply after the deadline) are dropped. The
    /// continuation is taken out before it is resumed, so it is resumed exactly once.
    func complete(_ result: Result<RESPValue, RedisError>) {
        guard let continuation else { return }
        self.continuation = nil
        timer?.cancel()
        timer = nil
        continuation.resume(with: result.mapError { $0 })
    }

    func handleScheduledCallback(eventLoop: some EventLoop) {
        timer = nil
        complete(.failure(RedisError(.timeout, timeoutMessage)))
    }
}

/// Matches replies to commands on one connection. Commands are pipelined: each write appends
/// who waits for its reply, each parsed reply completes the oldest. Runs on the channel's event
/// loop only.
final class RedisChannelHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = RedisRequest
    typealias OutboundOut = ByteBuffer

    /// Who waits for a reply: a promise (commands sent from any thread through the channel), or
    /// a task on this loop (`send(_:to:)`).
    private enum Waiting {
        case promise(EventLoopPromise<RESPValue>)
        case waiter(RedisReplyWaiter)

        func complete(_ result: Result<RESPValue, RedisError>) {
            switch self {
            case .promise(let promise): promise.completeWith(result.mapError { $0 })
            case .waiter(let waiter): waiter.complete(result)
            }
        }
    }

    private let parser: RESPParser
    private let maxPending: Int
    private var received: ByteBuffer?
    private var pending = CircularBuffer<Waiting>()
    /// Set while the handler is in the pipeline, for `send(_:to:)`.
    private var context: ChannelHandlerContext?
    private var failure: RedisError? {
        didSet { if let failure { record?.record(failure) } }
    }
    private let record: ConnectionFailure?

    init(parser: RESPParser = RESPParser(), maxPending: Int, record: ConnectionFailure? = nil) {
        self.parser = parser
        self.maxPending = maxPending
        self.record = record
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        failAll(failure ?? RedisError(.connection, "the connection was closed"))
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let request = unwrapOutboundIn(data)
        if let refusal = refusal() {
            request.promise.fail(refusal)
            promise?.fail(refusal)
            return
        }
        pending.append(.promise(request.promise))
        context.write(wrapOutboundOut(request.bytes), promise: promise)
    }

    /// Sends one encoded command whose reply completes `waiter`. On the channel's event loop. A
    /// write that fails closes the channel, which fails every command waiting on it.
    func send(_ bytes: ByteBuffer, to waiter: RedisReplyWaiter) {
        guard let context else {
            waiter.complete(.failure(failure ?? RedisError(.connection, "the connection was closed")))
            return
        }
        if let refusal = refusal() {
            waiter.complete(.failure(refusal))
            return
        }
        pending.append(.waiter(waiter))
        context.writeAndFlush(wrapOutboundOut(bytes), promise: nil)
    }

    /// Why a new command cannot be sent on this connection, if it cannot.
    private func refusal() -> RedisError? {
        if let failure { return failure }
        guard pending.count < maxPending else {
            return RedisError(.unavailable, "too many commands waiting for a reply on one connection")
        }
        return nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        if received == nil || received!.readableBytes == 0 {
            received = bytes
        } else {
            received!.writeBuffer(&bytes)
        }
        do {
            while received!.readableBytes > 0, let value = try parser.parse(&received!) {
                guard let waiting = pending.popFirst() else {
                    // RESP3 pushes (`>`) are only sent to clients that subscribe or track keys,
                    // which this client never asks for: anything unsolicited is a broken stream.
                    fail(context: context, RedisError(.protocolViolation, "the server sent a reply no command asked for"))
                    return
                }
                waiting.complete(.success(value))
            }
            if received!.readableBytes == 0 {
                received!.clear()
            } else {
                received!.discardReadBytes()
            }
        } catch {
            fail(context: context, RedisError(.protocolViolation, "the server's reply is not RESP: \(error.description)"))
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        failAll(failure ?? RedisError(.connection, "the connection was closed"))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let tls = error as? NIOSSLError {
            fail(context: context, RedisError(.tls, "TLS failed: \(tls)"))
        } else if let redis = error as? RedisError {
            fail(context: context, redis)
        } else {
            fail(context: context, RedisError(.connection, "the connection failed: \(error)"))
        }
    }

    private func fail(context: ChannelHandlerContext, _ error: RedisError) {
        if failure == nil { failure = error }
        failAll(error)
        context.close(promise: nil)
    }

    private func failAll(_ error: RedisError) {
        if failure == nil { failure = error }
        while let waiting = pending.popFirst() { waiting.complete(.failure(error)) }
    }
}

/// One open, greeted connection: `HELLO`/`AUTH` and `SELECT` are done. Commands sent on it from
/// any thread are pipelined in the order they are sent.
final class RedisConnection: Sendable {
    let channel: any Channel
    /// 3 when the server took `HELLO 3`, 2 after the fallback.
    let protocolVersion: Int
    /// For commands sent from the channel's own loop (`send(_:to:)`).
    private let handler: NIOLoopBound<RedisChannelHandler>

    private init(channel: any Channel, protocolVersion: Int, handler: NIOLoopBound<RedisChannelHandler>) {
        self.channel = channel
        self.protocolVersion = protocolVersion
        self.handler = handler
    }

    /// Sends one encoded command whose reply completes `waiter`, straight to the handler. On the
    /// channel's event loop.
    func send(_ bytes: ByteBuffer, to waiter: RedisReplyWaiter) {
        handler.value.send(bytes, to: waiter)
    }

    /// Sends one encoded command; the future fails only for transport problems (a server error
    /// reply is a `.error` value).
    func send(_ bytes: ByteBuffer) -> EventLoopFuture<RESPValue> {
        let promise = channel.eventLoop.makePromise(of: RESPValue.self)
        channel.writeAndFlush(RedisRequest(bytes: bytes, promise: promise)).whenFailure { error in
            promise.fail(error as? RedisError ?? RedisError(.connection, "cannot send to the server: \(error)"))
        }
        return promise.futureResult
    }

    /// Sends several commands in one write; replies come back in order.
    func send(pipeline commands: [ByteBuffer]) -> [EventLoopFuture<RESPValue>] {
        let futures = commands.map { bytes in
            let promise = channel.eventLoop.makePromise(of: RESPValue.self)
            channel.write(RedisRequest(bytes: bytes, promise: promise)).whenFailure { error in
                promise.fail(error as? RedisError ?? RedisError(.connection, "cannot send to the server: \(error)"))
            }
            return promise.futureResult
        }
        channel.flush()
        return futures
    }

    func close() {
        channel.close(promise: nil)
    }

    static func encode(_ arguments: [RedisArgument]) -> ByteBuffer {
        var buffer = ByteBuffer()
        RESPEncoder.writeCommand(arguments, into: &buffer)
        return buffer
    }

    /// Opens a connection to `configuration` and greets the server, within `connectTimeout`.
    static func connect(_ configuration: RedisConfiguration, sslContext: NIOSSLContext?,
                        on eventLoop: any EventLoop) -> EventLoopFuture<RedisConnection> {
        let serverName = configuration.tlsServerName ?? (isIPAddress(configuration.host) ? nil : configuration.host)
        let maxPending = configuration.maxPendingPerConnection
        let record = ConnectionFailure()
        let bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(configuration.connectTimeout)
            .channelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let sslContext {
                        let tls = try NIOSSLClientHandler(context: sslContext, serverHostname: serverName)
                        try channel.pipeline.syncOperations.addHandler(tls)
                    }
                    // The commands sent in one turn of the loop (each request flushes its own) leave as one write.
                    try channel.pipeline.syncOperations.addHandler(FlushCoalescingHandler())
                    try channel.pipeline.syncOperations.addHandler(RedisChannelHandler(maxPending: maxPending, record: record))
                }
            }
        let connected = bootstrap.connect(host: configuration.host, port: configuration.port)
            .flatMapErrorThrowing { error in
                throw error as? RedisError ?? RedisError(.connection, "cannot connect to \(configuration): \(describe(error))")
            }
        let deadline = NIODeadline.now() + configuration.connectTimeout
        return connected.flatMap { channel in
            let greeted = greet(channel: channel, configuration)
            let timer = eventLoop.scheduleTask(deadline: deadline) {
                channel.close(promise: nil)
            }
            return greeted.always { _ in timer.cancel() }.flatMapError { error in
                channel.close(promise: nil)
                // A closed channel's write failure hides why it closed (a failed handshake).
                let error: any Error = (error as? RedisError)?.code == .connection ? record.error ?? error : error
                if NIODeadline.now() >= deadline, (error as? RedisError)?.code == .connection {
                    return eventLoop.makeFailedFuture(RedisError(.timeout, "no greeting from \(configuration) within the connect timeout"))
                }
                return eventLoop.makeFailedFuture(error)
            }
        }
    }

    /// `HELLO 3` (with `AUTH` and `SETNAME`), falling back to RESP2 (`AUTH`) when the server
    /// does not know `HELLO` or protocol 3; then `SELECT`.
    private static func greet(channel: any Channel, _ configuration: RedisConfiguration) -> EventLoopFuture<RedisConnection> {
        let eventLoop = channel.eventLoop
        // On the channel's loop (the connect future's callback), where the pipeline is readable.
        guard let found = try? channel.pipeline.syncOperations.handler(type: RedisChannelHandler.self) else {
            return eventLoop.makeFailedFuture(RedisError(.connection, "the connection to \(configuration) closed before its greeting"))
        }
        let handler = NIOLoopBound(found, eventLoop: eventLoop)
        let probe = RedisConnection(channel: channel, protocolVersion: 3, handler: handler)
        var hello: [RedisArgument] = ["HELLO", "3"]
        if let password = configuration.password {
            hello += ["AUTH", .string(configuration.username ?? "default"), .string(password)]
        }
        if let name = configuration.clientName { hello += ["SETNAME", .string(name)] }
        let greeted = probe.send(encode(hello)).flatMap { reply -> EventLoopFuture<Int> in
            guard case .error(let message) = reply else { return eventLoop.makeSucceededFuture(3) }
            let unknown = message.hasPrefix("NOPROTO") || message.lowercased().hasPrefix("err unknown command")
            guard unknown else { return eventLoop.makeFailedFuture(greetingError(message, configuration)) }
            // RESP2 server (Redis < 6): authenticate the old way.
            guard let password = configuration.password else { return eventLoop.makeSucceededFuture(2) }
            var auth: [RedisArgument] = ["AUTH"]
            if let user = configuration.username { auth.append(.string(user)) }
            auth.append(.string(password))
            return probe.send(encode(auth)).flatMapThrowing { reply in
                if case .error(let message) = reply { throw greetingError(message, configuration) }
                return 2
            }
        }
        return greeted.flatMap { version in
            let connection = RedisConnection(channel: channel, protocolVersion: version, handler: handler)
            guard configuration.database != 0 else { return eventLoop.makeSucceededFuture(connection) }
            return connection.send(encode(["SELECT", .string(String(configuration.database))])).flatMapThrowing { reply in
                if case .error(let message) = reply {
                    throw RedisError(.server, "SELECT \(configuration.database) failed on \(configuration): \(message)")
                }
                return connection
            }
        }
    }

    /// The server's refusal of `HELLO`/`AUTH`, never echoing the password.
    static func greetingError(_ message: String, _ configuration: RedisConfiguration) -> RedisError {
        let upper = message.uppercased()
        let auth = ["WRONGPASS", "NOAUTH", "NOPERM"].contains { upper.hasPrefix($0) }
            || upper.contains("PASSWORD") || upper.contains("AUTH")
        var shown = message
        if let password = configuration.password, !password.isEmpty {
            shown = shown.replacingOccurrences(password, with: "***")
        }
        return RedisError(auth ? .authentication : .server,
                          auth ? "authentication to \(configuration) failed: \(shown)" : "\(configuration) refused the greeting: \(shown)")
    }

    static func isIPAddress(_ host: String) -> Bool {
        (try? SocketAddress(ipAddress: host, port: 0)) != nil
    }

    /// A connect error in words (NIO's own descriptions of refused or timed-out connects).
    static func describe(_ error: any Error) -> String {
        if let connect = error as? NIOConnectionError {
            let reasons = connect.connectionErrors.map { "\($0.error)" }
            return reasons.first ?? (connect.dnsAAAAError ?? connect.dnsAError).map { "\($0)" } ?? "\(connect)"
        }
        if let channelError = error as? ChannelError, case .connectTimeout(_) = channelError { return "connect timed out" }
        return "\(error)"
    }
}

extension String {
    /// Every occurrence of `target` replaced (without Foundation).
    func replacingOccurrences(_ target: String, with replacement: String) -> String {
        guard !target.isEmpty else { return self }
        var result = ""
        var rest = self[...]
        while let range = rest.firstRange(of: target) {
            result += String(rest[..<range.lowerBound]) + replacement
            rest = rest[range.upperBound...]
        }
        return result + rest
    }
}
