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

/// Matches replies to commands on one connection. Commands are pipelined: each write appends
/// its promise, each parsed reply completes the oldest. Runs on the channel's event loop only.
final class RedisChannelHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = RedisRequest
    typealias OutboundOut = ByteBuffer

    private let parser: RESPParser
    private let maxPending: Int
    private var received: ByteBuffer?
    private var pending = CircularBuffer<EventLoopPromise<RESPValue>>()
    private var failure: RedisError? {
        didSet { if let failure { record?.record(failure) } }
    }
    private let record: ConnectionFailure?

    init(parser: RESPParser = RESPParser(), maxPending: Int, record: ConnectionFailure? = nil) {
        self.parser = parser
        self.maxPending = maxPending
        self.record = record
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let request = unwrapOutboundIn(data)
        if let failure {
            request.promise.fail(failure)
            promise?.fail(failure)
            return
        }
        guard pending.count < maxPending else {
            let error = RedisError(.unavailable, "too many commands waiting for a reply on one connection")
            request.promise.fail(error)
            promise?.fail(error)
            return
        }
        pending.append(request.promise)
        context.write(wrapOutboundOut(request.bytes), promise: promise)
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
                guard let promise = pending.popFirst() else {
                    // RESP3 pushes (`>`) are only sent to clients that subscribe or track keys,
                    // which this client never asks for: anything unsolicited is a broken stream.
                    fail(context: context, RedisError(.protocolViolation, "the server sent a reply no command asked for"))
                    return
                }
                promise.succeed(value)
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
        while let promise = pending.popFirst() { promise.fail(error) }
    }
}

/// One open, greeted connection: `HELLO`/`AUTH` and `SELECT` are done. Commands sent on it from
/// any thread are pipelined in the order they are sent.
final class RedisConnection: Sendable {
    let channel: any Channel
    /// 3 when the server took `HELLO 3`, 2 after the fallback.
    let protocolVersion: Int

    private init(channel: any Channel, protocolVersion: Int) {
        self.channel = channel
        self.protocolVersion = protocolVersion
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
        let probe = RedisConnection(channel: channel, protocolVersion: 3)
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
            let connection = RedisConnection(channel: channel, protocolVersion: version)
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
