import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// Connections to one Redis server, a few on each event loop of `eventLoopGroup`, each shared by
/// any number of callers (commands are pipelined), opened on first use and reopened after a
/// failure with jittered exponential backoff. While a connection waits out its backoff,
/// commands that would need it fail at once with `.unavailable`: a down server costs callers
/// nothing, and the first command after the wait reconnects, so service resumes by itself when
/// the server returns.
///
/// A command sent from one of the group's loops (a gateway request's task runs on its pair's
/// loop) goes out on that loop's connections and its reply completes there: no thread hop and
/// no state another core writes (`RedisConnectionLane`). Callers on no loop of the group are
/// dealt a loop in turn.
///
/// Every command has a deadline covering the wait for a connection and the reply; past it the
/// caller gets `.timeout` (a late reply is then read and dropped, the connection kept).
public final class RedisConnectionPool: Sendable {
    public let configuration: RedisConfiguration
    /// A command's timeout message: made once, not per command.
    private let timeoutMessage: String
    private let sslContext: NIOSSLContext?
    private let logger: Logger
    private let lanes: [RedisConnectionLane]
    /// Loop identity → lane (built once, read-only afterwards).
    private let laneIndex: [ObjectIdentifier: Int]
    /// The lane a caller on no loop of the group gets next.
    private let turn = Atomic<Int>(0)

    /// `sslContext` is made once here from `configuration.tls` (it parses certificates).
    /// `configuration.connections` is spread over the group's loops, at least one each.
    public convenience init(configuration: RedisConfiguration, eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                            logger: Logger = Logger(label: "redis", factory: { _ in SwiftLogNoOpLogHandler() })) throws {
        let sslContext = try configuration.tls.map { try NIOSSLContext(configuration: $0) }
        self.init(configuration: configuration, sslContext: sslContext, eventLoopGroup: eventLoopGroup, logger: logger)
    }

    private init(configuration: RedisConfiguration, sslContext: NIOSSLContext?, eventLoopGroup: any EventLoopGroup, logger: Logger) {
        self.configuration = configuration
        timeoutMessage = "no reply from \(configuration) in time"
        self.sslContext = sslContext
        self.logger = logger
        let loops = Array(eventLoopGroup.makeIterator())
        let perLoop = Self.connectionsPerLoop(configuration.connections, loops: loops.count)
        lanes = loops.map {
            RedisConnectionLane(eventLoop: $0, connections: perLoop, configuration: configuration, sslContext: sslContext, logger: logger)
        }
        var index: [ObjectIdentifier: Int] = [:]
        for (position, loop) in loops.enumerated() { index[ObjectIdentifier(loop)] = position }
        laneIndex = index
    }

    /// Another pool to the same server with this one's TLS context (its certificates are not
    /// read again, and it cannot fail): for a connection of its own, such as one whose blocked
    /// reads must not hold up this pool's pipelined commands. `adjust` changes what differs.
    public func sibling(on eventLoopGroup: any EventLoopGroup, adjust: (inout RedisConfiguration) -> Void) -> RedisConnectionPool {
        var configuration = self.configuration
        adjust(&configuration)
        return RedisConnectionPool(configuration: configuration, sslContext: sslContext, eventLoopGroup: eventLoopGroup, logger: logger)
    }

    /// `connections` over `loops`, rounded up, at least one per loop.
    static func connectionsPerLoop(_ connections: Int, loops: Int) -> Int {
        let loops = max(1, loops)
        return max(1, (max(1, connections) + loops - 1) / loops)
    }

    /// The caller's own loop's lane, or one dealt in turn.
    private var lane: RedisConnectionLane {
        if let current = MultiThreadedEventLoopGroup.currentEventLoop, let index = laneIndex[ObjectIdentifier(current)] {
            return lanes[index]
        }
        let dealt = UInt(bitPattern: turn.wrappingAdd(1, ordering: .relaxed).oldValue)
        return lanes[Int(dealt % UInt(lanes.count))]
    }

    /// Opens one connection now (instead of on the first command) and reports how that went, so
    /// a wrong password or an unreachable server shows at start rather than on the first request.
    public func warmUp() async throws(RedisError) {
        _ = try await send(["PING"], timeout: configuration.connectTimeout)
    }

    /// Sends one command and returns its reply; a server error reply throws `.server`.
    public func send(_ arguments: [RedisArgument], timeout: TimeAmount? = nil) async throws(RedisError) -> RESPValue {
        let reply = try await exchange(RedisConnection.encode(arguments), deadline: deadline(timeout))
        if case .error(let message) = reply {
            throw RedisError(.server, message)
        }
        return reply
    }

    /// Sends the commands in one write on one connection; each reply is returned as the server
    /// sent it (a server error is an `.error` value, not thrown). Transport failures throw.
    public func pipeline(_ commands: [[RedisArgument]], timeout: TimeAmount? = nil) async throws(RedisError) -> [RESPValue] {
        let deadline = deadline(timeout)
        let lane = lane
        let ready = lane.connection()
        // On the lane's own event loop: no hop between loops per command.
        let eventLoop = lane.eventLoop
        let promise = eventLoop.makePromise(of: [RESPValue].self)
        let timer = scheduleTimeout(promise, deadline: deadline, on: eventLoop)
        ready.flatMap { connection in
            EventLoopFuture.whenAllSucceed(connection.send(pipeline: commands.map(RedisConnection.encode)), on: eventLoop)
        }.cascade(to: promise)
        promise.futureResult.whenComplete { _ in timer.cancel() }
        return try await result(of: promise.futureResult)
    }

    /// Runs `script` with `EVALSHA`, and with `EVAL` (which loads it) when the server answers
    /// `NOSCRIPT` — after a restart or `SCRIPT FLUSH`. One deadline covers both.
    public func evaluate(_ script: RedisScript, keys: [RedisArgument], arguments: [RedisArgument],
                         timeout: TimeAmount? = nil) async throws(RedisError) -> RESPValue {
        let deadline = deadline(timeout)
        let tail: [RedisArgument] = [.string(String(keys.count))] + keys + arguments
        let reply = try await exchange(RedisConnection.encode(["EVALSHA", .string(script.sha1)] + tail), deadline: deadline)
        switch reply {
        case .error(let message) where message.hasPrefix("NOSCRIPT"):
            let loaded = try await exchange(RedisConnection.encode(["EVAL", .string(script.source)] + tail), deadline: deadline)
            if case .error(let message) = loaded { throw RedisError(.server, message) }
            return loaded
        case .error(let message):
            throw RedisError(.server, message)
        default:
            return reply
        }
    }

    /// Closes every connection; later commands fail with `.shutdown`. Idempotent.
    public func shutdown() async {
        for lane in lanes { lane.shutdown() }
    }

    /// Connections open right now (tests, diagnostics).
    public var openConnections: Int {
        lanes.reduce(0) { $0 + $1.openConnections }
    }

    /// Connections each loop keeps at most.
    public var connectionsPerLoop: Int { Self.connectionsPerLoop(configuration.connections, loops: lanes.count) }

    // MARK: Internals

    private func deadline(_ timeout: TimeAmount?) -> NIODeadline {
        NIODeadline.now() + (timeout ?? configuration.commandTimeout)
    }

    private func result<Value: Sendable>(of future: EventLoopFuture<Value>) async throws(RedisError) -> Value {
        do {
            return try await future.get()
        } catch let error as RedisError {
            throw error
        } catch {
            throw RedisError(.connection, "\(error)")
        }
    }

    /// Sends one encoded command on the caller's lane and waits for its reply until `deadline`.
    /// A caller on the lane's loop (a request's task) hands the command to an open connection's
    /// handler there, and the reply resumes it from there.
    private func exchange(_ bytes: ByteBuffer, deadline: NIODeadline) async throws(RedisError) -> RESPValue {
        let lane = lane
        let timeoutMessage = timeoutMessage
        do {
            return try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<RESPValue, any Error>) in
                if lane.eventLoop.inEventLoop {
                    Self.start(bytes, on: lane, deadline: deadline, timeoutMessage: timeoutMessage, continuation)
                } else {
                    lane.eventLoop.execute { Self.start(bytes, on: lane, deadline: deadline, timeoutMessage: timeoutMessage, continuation) }
                }
            }
        } catch let error as RedisError {
            throw error
        } catch {
            throw RedisError(.connection, "\(error)")
        }
    }

    /// `exchange` on the lane's loop: the command goes to an open connection at once, or once
    /// one is open (connecting, or backing off: then it fails at once). The waiter's deadline
    /// covers both.
    private static func start(_ bytes: ByteBuffer, on lane: RedisConnectionLane, deadline: NIODeadline, timeoutMessage: String,
                              _ continuation: UnsafeContinuation<RESPValue, any Error>) {
        let waiter = RedisReplyWaiter(continuation, timeoutMessage: timeoutMessage)
        guard waiter.arm(deadline, on: lane.eventLoop) else { return }
        if let connection = lane.openConnection() {
            connection.send(bytes, to: waiter)
            return
        }
        let bound = NIOLoopBound(waiter, eventLoop: lane.eventLoop)
        lane.connection().whenComplete { result in
            // The lane's futures complete on its loop.
            switch result {
            case .success(let connection): connection.send(bytes, to: bound.value)
            case .failure(let error): bound.value.complete(.failure(error as? RedisError ?? RedisError(.connection, "\(error)")))
            }
        }
    }

    private func scheduleTimeout<Value>(_ promise: EventLoopPromise<Value>, deadline: NIODeadline,
                                        on eventLoop: any EventLoop) -> Scheduled<Void> {
        let timeoutMessage = timeoutMessage
        return eventLoop.scheduleTask(deadline: deadline) {
            promise.fail(RedisError(.timeout, timeoutMessage))
        }
    }

    func backoff(afterFailures failures: Int) -> TimeAmount {
        RedisConnectionLane.backoff(afterFailures: failures, configuration)
    }
}
