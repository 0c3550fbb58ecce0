import Logging
import NIOCore
import NIOPosix
import RedisClient
import Synchronization

/// Every replica's memory tier hears the fleet's invalidations and purges (issue #43): a task
/// that waits on the store's `events` stream (`XREAD BLOCK`, on a connection of its own) and
/// drops from this replica's memory what another replica invalidated, as soon as it is
/// published — a Redis round trip after the other replica's write, so in practice before that
/// replica's client has its answer and can ask here.
///
/// Its own connection because a blocked read holds up whatever is pipelined behind it: the
/// requests' commands never queue behind the feed. The stream remembers what a replica missed
/// while it could not read, so a reconnect loses nothing. What the stream no longer remembers
/// (trimmed, or Redis restarted) shows as a gap in the events' sequence numbers: then nothing
/// in memory can be trusted, and the memory tier is emptied — the fleet tier still holds what
/// is valid, so it refills cheaply.
final class CacheInvalidationFeed: Sendable {
    private struct Position {
        var lastID: String?
        var lastSequence: Int64?
    }

    let tier: SharedCacheTier
    let memory: InMemoryCacheStore
    let metrics: CacheMetrics
    /// How long one blocked read waits for an event before it asks again.
    let block: Duration
    /// The wait after a failed read (Redis down) before the next.
    let retryInterval: Duration
    private let position = Mutex(Position())
    /// The running task and its connection (closed by `stop`, which ends a blocked read at once).
    private let running = Mutex<(task: Task<Void, Never>, listener: RedisConnectionPool)?>(nil)
    private let logger: Logger

    init(tier: SharedCacheTier, memory: InMemoryCacheStore, metrics: CacheMetrics, block: Duration = .seconds(1),
         retryInterval: Duration = .milliseconds(250), logger: Logger) {
        self.tier = tier
        self.memory = memory
        self.metrics = metrics
        self.block = block
        self.retryInterval = retryInterval
        self.logger = logger
    }

    /// Opens the feed's connection and starts following. A second call (or one racing the
    /// first) finds it running and does nothing: there is only ever one listener to shut down.
    func start() {
        running.withLock { running in
            guard running == nil else { return }
            // One loop: the listener's one connection, whichever thread starts a read. The
            // store's TLS context is shared, not made again.
            let block = block, retryInterval = retryInterval
            let listener = tier.backend.pool.sibling(on: MultiThreadedEventLoopGroup.singleton.next()) { configuration in
                configuration.connections = 1
                configuration.commandTimeout = .nanoseconds(GatewayMetrics.nanoseconds(block)) + configuration.connectTimeout
                configuration.clientName = "portico-cache-feed"
            }
            let task = Task { [self] in
                while !Task.isCancelled {
                    if await !poll(waiting: block, on: listener) {
                        try? await Task.sleep(for: retryInterval)
                    }
                }
            }
            running = (task, listener)
        }
    }

    func stop() async {
        guard let (task, listener) = running.withLock({ running in
            defer { running = nil }
            return running
        }) else { return }
        task.cancel()
        await listener.shutdown()
        await task.value
    }

    /// Whether the feed knows where the stream stands (its first read is done): events from then
    /// on reach this replica.
    var following: Bool { position.withLock { $0.lastID != nil } }

    /// Reads what was published since the last read, without waiting, and applies it (tests
    /// call it by hand instead of starting the feed).
    func poll() async {
        _ = await poll(waiting: nil, on: tier.backend.pool)
    }

    /// One read: `waiting` blocks up to that long for a first event (on `pool`, which then must
    /// be the feed's own connection). `false` when Redis did not answer.
    private func poll(waiting: Duration?, on pool: RedisConnectionPool) async -> Bool {
        let start = position.withLock { $0 }
        guard let lastID = start.lastID else {
            return await begin(on: pool)
        }
        var command: [RedisArgument] = ["XREAD", "COUNT", "512"]
        if let waiting { command += ["BLOCK", .string(String(max(1, waiting.wholeMilliseconds)))] }
        command += ["STREAMS", .bytes(tier.eventsKey), .string(lastID)]
        let reply: RESPValue
        do throws(RedisError) {
            reply = try await pool.send(command)
        } catch {
            return false  // the stream keeps what this replica missed
        }
        apply(Self.entries(ofRead: reply), after: start)
        return true
    }

    private func apply(_ reply: RESPValue, after start: Position) {
        guard let lastID = start.lastID else { return }
        var id = lastID
        var sequence = start.lastSequence
        for event in Self.events(in: reply) {
            if let sequence, event.sequence != sequence + 1 {
                // Events were lost (trimmed while this replica was away, or a Redis restart).
                metrics.record(memory.removeEverything().change)
                logger.notice("fleet cache: invalidations were missed; emptied this replica's memory tier",
                              metadata: ["expected": "\(sequence + 1)", "got": "\(event.sequence)"])
            } else if event.origin != tier.replicaID, let target = event.target {
                let (removed, change) = memory.removeAll(matching: target)
                metrics.record(change)
                if removed > 0 { tier.count(.invalidated, by: Int64(removed)) }
            }
            id = event.id
            sequence = event.sequence
        }
        position.withLock { $0 = Position(lastID: id, lastSequence: sequence) }
    }

    /// Starts from the newest event: what came before was published before this tier existed.
    private func begin(on pool: RedisConnectionPool) async -> Bool {
        guard let reply = try? await pool.send(["XREVRANGE", .bytes(tier.eventsKey), "+", "-", "COUNT", "1"]) else {
            return false
        }
        let newest = Self.events(in: reply).first
        position.withLock { $0 = Position(lastID: newest?.id ?? "0-0", lastSequence: newest?.sequence) }
        return true
    }

    /// The entries of an `XREAD` reply for one stream — RESP3 `{key: entries}`, RESP2
    /// `[[key, entries]]`, `null` when the wait ended with nothing — as an `XRANGE` reply.
    static func entries(ofRead reply: RESPValue) -> RESPValue {
        switch reply {
        case .map(let pairs): pairs.first?.value ?? .array([])
        case .array(let streams): streams.first?.array.flatMap { $0.count == 2 ? $0[1] : nil } ?? .array([])
        default: .array([])
        }
    }

    struct Event: Equatable {
        var id: String
        var sequence: Int64
        var origin: String
        var target: CachePurgeTarget?
    }

    /// The events of an `XRANGE` reply (`[[id, [field, value, …]], …]`); malformed ones skipped.
    static func events(in reply: RESPValue) -> [Event] {
        guard let items = reply.array else { return [] }
        return items.compactMap { item in
            guard let parts = item.array, parts.count == 2, let id = parts[0].string, let flat = parts[1].array else { return nil }
            var fields: [String: String] = [:]
            for i in stride(from: 0, to: flat.count - 1, by: 2) {
                if let name = flat[i].string, let value = flat[i + 1].string { fields[name] = value }
            }
            guard let sequence = fields["seq"].flatMap({ Int64($0) }), let origin = fields["origin"],
                  let value = fields["value"] else { return nil }
            let authority = fields["authority"].flatMap { $0.isEmpty ? nil : $0 }
            let target: CachePurgeTarget? = switch fields["kind"] {
            case "key": .key(value)
            case "prefix": .prefix(value, authority: authority)
            case "tag": .tag(value)
            default: nil
            }
            return Event(id: id, sequence: sequence, origin: origin, target: target)
        }
    }
}
