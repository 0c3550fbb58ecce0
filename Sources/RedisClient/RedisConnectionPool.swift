import Logging
import NIOCore
import NIOPosix
import NIOSSL
import Synchronization

/// A fixed number of connections to one Redis server, each shared by any number of callers
/// (commands are pipelined), opened on first use and reopened after a failure with jittered
/// exponential backoff. While a connection waits out its backoff, commands that would need it
/// fail at once with `.unavailable`: a down server costs callers nothing, and the first command
/// after the wait reconnects, so service resumes by itself when the server returns.
///
/// Every command has a deadline covering the wait for a connection and the reply; past it the
/// caller gets `.timeout` (a late reply is then read and dropped, the connection kept).
public final class RedisConnectionPool: Sendable {
    public let configuration: RedisConfiguration
    private let group: any EventLoopGroup
    private let sslContext: NIOSSLContext?
    private let logger: Logger
    private let state: Mutex<State>

    enum Slot {
        case idle
        case connecting(EventLoopFuture<RedisConnection>)
        case connected(RedisConnection)
        /// After `failures` failed connects in a row: no new attempt before `until`.
        case backingOff(until: NIODeadline, error: RedisError)
    }

    struct State {
        var slots: [Slot]
        var failures: [Int]
        var next = 0
        var shutDown = false
    }

    /// What to do once the lock is let go.
    private enum Step {
        case use(EventLoopFuture<RedisConnection>)
        case open(slot: Int, EventLoopPromise<RedisConnection>)
        case fail(RedisError)
    }

    /// `sslContext` is made once here from `configuration.tls` (it parses certificates).
    public init(configuration: RedisConfiguration, eventLoopGroup: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
                logger: Logger = Logger(label: "redis", factory: { _ in SwiftLogNoOpLogHandler() })) throws {
        self.configuration = configuration
        self.group = eventLoopGroup
        self.logger = logger
        self.sslContext = try configuration.tls.map { try NIOSSLContext(configuration: $0) }
        let count = max(1, configuration.connections)
        self.state = Mutex(State(slots: Array(repeating: .idle, count: count), failures: Array(repeating: 0, count: count)))
    }

    /// Opens one connection now (instead of on the first command) and reports how that went, so
    /// a wrong password or an unreachable server shows at start rather than on the first request.
    public func warmUp() async throws(RedisError) {
        _ = try await send(["PING"], timeout: configuration.connectTimeout)
    }

    /// Sends one command and returns its reply; a server error reply throws `.server`.
    public func send(_ arguments: [RedisArgument], timeout: TimeAmount? = nil) async throws(RedisError) -> RESPValue {
        let reply = try await result(of: sendFuture(RedisConnection.encode(arguments), deadline: deadline(timeout)))
        if case .error(let message) = reply {
            throw RedisError(.server, message)
        }
        return reply
    }

    /// Sends the commands in one write on one connection; each reply is returned as the server
    /// sent it (a server error is an `.error` value, not thrown). Transport failures throw.
    public func pipeline(_ commands: [[RedisArgument]], timeout: TimeAmount? = nil) async throws(RedisError) -> [RESPValue] {
        let deadline = deadline(timeout)
        let ready = connection(deadline: deadline)
        // On the connection's own event loop: no hop between loops per command.
        let eventLoop = ready.eventLoop
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
        let reply = try await result(of: sendFuture(RedisConnection.encode(["EVALSHA", .string(script.sha1)] + tail), deadline: deadline))
        switch reply {
        case .error(let message) where message.hasPrefix("NOSCRIPT"):
            let loaded = try await result(of: sendFuture(RedisConnection.encode(["EVAL", .string(script.source)] + tail), deadline: deadline))
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
        let slots = state.withLock { state -> [Slot] in
            state.shutDown = true
            defer { state.slots = state.slots.map { _ in .idle } }
            return state.slots
        }
        for slot in slots {
            switch slot {
            case .connected(let connection):
                connection.close()
            case .connecting(let future):
                future.whenSuccess { $0.close() }
            case .idle, .backingOff:
                break
            }
        }
    }

    /// Connections open right now (tests, diagnostics).
    public var openConnections: Int {
        state.withLock { state in
            state.slots.reduce(0) { count, slot in
                if case .connected = slot { return count + 1 }
                return count
            }
        }
    }

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

    private func sendFuture(_ bytes: ByteBuffer, deadline: NIODeadline) -> EventLoopFuture<RESPValue> {
        let ready = connection(deadline: deadline)
        // On the connection's own event loop: no hop between loops per command.
        let eventLoop = ready.eventLoop
        let promise = eventLoop.makePromise(of: RESPValue.self)
        let timer = scheduleTimeout(promise, deadline: deadline, on: eventLoop)
        ready.flatMap { $0.send(bytes) }.cascade(to: promise)
        promise.futureResult.whenComplete { _ in timer.cancel() }
        return promise.futureResult
    }

    private func scheduleTimeout<Value>(_ promise: EventLoopPromise<Value>, deadline: NIODeadline,
                                        on eventLoop: any EventLoop) -> Scheduled<Void> {
        let shown = configuration.description
        return eventLoop.scheduleTask(deadline: deadline) {
            promise.fail(RedisError(.timeout, "no reply from \(shown) in time"))
        }
    }

    /// A connection for a command: an open one (round robin), one being opened, or a new one.
    private func connection(deadline: NIODeadline) -> EventLoopFuture<RedisConnection> {
        let now = NIODeadline.now()
        let step = state.withLock { state -> Step in
            guard !state.shutDown else { return .fail(RedisError(.shutdown, "the Redis pool was shut down")) }
            let count = state.slots.count
            let start = state.next
            state.next = (state.next + 1) % count
            for offset in 0..<count {
                if case .connected(let connection) = state.slots[(start + offset) % count] {
                    return .use(connection.channel.eventLoop.makeSucceededFuture(connection))
                }
            }
            for offset in 0..<count {
                let index = (start + offset) % count
                switch state.slots[index] {
                case .connecting(let future):
                    return .use(future)
                case .idle:
                    return openSlot(index, &state)
                case .backingOff(let until, _) where until <= now:
                    return openSlot(index, &state)
                default:
                    continue
                }
            }
            if case .backingOff(_, let error) = state.slots[start] {
                return .fail(RedisError(.unavailable, "\(configuration) is unavailable (\(error.message)); retrying shortly"))
            }
            return .fail(RedisError(.unavailable, "\(configuration) is unavailable"))
        }
        switch step {
        case .use(let future):
            return future
        case .fail(let error):
            return group.any().makeFailedFuture(error)
        case .open(let index, let promise):
            RedisConnection.connect(configuration, sslContext: sslContext, on: promise.futureResult.eventLoop)
                .whenComplete { result in self.opened(index, result, promise: promise) }
            return promise.futureResult
        }
    }

    private func openSlot(_ index: Int, _ state: inout State) -> Step {
        let promise = group.any().makePromise(of: RedisConnection.self)
        state.slots[index] = .connecting(promise.futureResult)
        return .open(slot: index, promise)
    }

    private func opened(_ index: Int, _ result: Result<RedisConnection, any Error>, promise: EventLoopPromise<RedisConnection>) {
        switch result {
        case .success(let connection):
            let keep = state.withLock { state -> Bool in
                guard !state.shutDown else { return false }
                state.slots[index] = .connected(connection)
                if state.failures[index] > 0 {
                    logger.info("redis connection restored", metadata: ["redis": "\(configuration)"])
                }
                state.failures[index] = 0
                return true
            }
            guard keep else {
                connection.close()
                promise.fail(RedisError(.shutdown, "the Redis pool was shut down"))
                return
            }
            connection.channel.closeFuture.whenComplete { _ in
                self.state.withLock { state in
                    if case .connected(let current) = state.slots[index], current === connection { state.slots[index] = .idle }
                }
            }
            promise.succeed(connection)
        case .failure(let failure):
            let error = failure as? RedisError ?? RedisError(.connection, "\(failure)")
            let (wait, failures) = state.withLock { state -> (TimeAmount, Int) in
                state.failures[index] += 1
                let wait = backoff(afterFailures: state.failures[index])
                if !state.shutDown { state.slots[index] = .backingOff(until: .now() + wait, error: error) }
                return (wait, state.failures[index])
            }
            // The first failure of a run is news; the retries after it are not.
            let level: Logger.Level = failures == 1 ? .warning : .debug
            logger.log(level: level, "redis connection failed", metadata: [
                "redis": "\(configuration)", "error": "\(error.message)", "retry_in_ms": "\(wait.nanoseconds / 1_000_000)",
            ])
            promise.fail(error)
        }
    }

    /// Full jitter: a random wait up to `min(cap, base·2ⁿ⁻¹)`.
    func backoff(afterFailures failures: Int) -> TimeAmount {
        let base = max(1, configuration.backoffBase.nanoseconds)
        let cap = max(base, configuration.backoffCap.nanoseconds)
        var ceiling = base
        for _ in 1..<max(1, failures) where ceiling < cap { ceiling *= 2 }
        return .nanoseconds(Int64.random(in: 0...min(cap, ceiling)))
    }
}
