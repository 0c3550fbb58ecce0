import Logging
import NIOCore
import NIOSSL
import Synchronization

/// One event loop's share of a `RedisConnectionPool`: its connections, all on that loop, opened
/// on first use and reopened after a failure with jittered exponential backoff.
///
/// A command from a task on this loop finds its connection here and its reply completes here,
/// so it never waits for another thread. The lock is this loop's own: only its thread takes it
/// on the request path (callers on no loop of the pool, which are background work, take it now
/// and then), so it is never contended by another core's requests.
final class RedisConnectionLane: Sendable {
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

    let eventLoop: any EventLoop
    private let configuration: RedisConfiguration
    private let sslContext: NIOSSLContext?
    private let logger: Logger
    private let state: Mutex<State>

    init(eventLoop: any EventLoop, connections: Int, configuration: RedisConfiguration, sslContext: NIOSSLContext?,
         logger: Logger) {
        self.eventLoop = eventLoop
        self.configuration = configuration
        self.sslContext = sslContext
        self.logger = logger
        let count = max(1, connections)
        self.state = Mutex(State(slots: Array(repeating: .idle, count: count), failures: Array(repeating: 0, count: count)))
    }

    /// An open connection (round robin), when there is one: the common case, without a future.
    func openConnection() -> RedisConnection? {
        state.withLock { state -> RedisConnection? in
            guard !state.shutDown else { return nil }
            return Self.nextOpen(&state).connection
        }
    }

    /// The next open connection in turn, if any, and the slot the turn began at; moves the turn on.
    private static func nextOpen(_ state: inout State) -> (connection: RedisConnection?, start: Int) {
        let count = state.slots.count
        let start = state.next
        state.next = (state.next + 1) % count
        for offset in 0..<count {
            if case .connected(let connection) = state.slots[(start + offset) % count] { return (connection, start) }
        }
        return (nil, start)
    }

    /// A connection for a command: an open one (round robin), one being opened, or a new one.
    func connection() -> EventLoopFuture<RedisConnection> {
        let now = NIODeadline.now()
        let step = state.withLock { state -> Step in
            guard !state.shutDown else { return .fail(RedisError(.shutdown, "the Redis pool was shut down")) }
            let (open, start) = Self.nextOpen(&state)
            if let open { return .use(eventLoop.makeSucceededFuture(open)) }
            let count = state.slots.count
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
            return eventLoop.makeFailedFuture(error)
        case .open(let index, let promise):
            RedisConnection.connect(configuration, sslContext: sslContext, on: eventLoop)
                .whenComplete { result in self.opened(index, result, promise: promise) }
            return promise.futureResult
        }
    }

    private func openSlot(_ index: Int, _ state: inout State) -> Step {
        let promise = eventLoop.makePromise(of: RedisConnection.self)
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
                let wait = Self.backoff(afterFailures: state.failures[index], configuration)
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
    static func backoff(afterFailures failures: Int, _ configuration: RedisConfiguration) -> TimeAmount {
        let base = max(1, configuration.backoffBase.nanoseconds)
        let cap = max(base, configuration.backoffCap.nanoseconds)
        var ceiling = base
        for _ in 1..<max(1, failures) where ceiling < cap { ceiling *= 2 }
        return .nanoseconds(Int64.random(in: 0...min(cap, ceiling)))
    }

    /// Closes every connection; later commands fail with `.shutdown`. Idempotent.
    func shutdown() {
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

    var openConnections: Int {
        state.withLock { state in
            state.slots.reduce(0) { count, slot in
                if case .connected = slot { return count + 1 }
                return count
            }
        }
    }
}
