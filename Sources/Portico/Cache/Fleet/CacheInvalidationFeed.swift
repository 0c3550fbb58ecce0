import Logging
import RedisClient
import Synchronization

/// Every replica's memory tier hears the fleet's invalidations and purges (issue #43): a task
/// that reads the store's `events` stream every `interval` (a quarter second: "within a
/// second") and drops from this replica's memory what another replica invalidated.
///
/// Polling with `XRANGE` rather than subscribing keeps to the request/response client the
/// stores already have, and survives reconnects: the stream remembers what a replica missed
/// while it could not read. What the stream no longer remembers (trimmed, or Redis restarted)
/// shows as a gap in the events' sequence numbers: then nothing in memory can be trusted, and
/// the memory tier is emptied — the fleet tier still holds what is valid, so it refills cheaply.
final class CacheInvalidationFeed: Sendable {
    private struct Position {
        var lastID: String?
        var lastSequence: Int64?
    }

    let tier: SharedCacheTier
    let memory: InMemoryCacheStore
    let metrics: CacheMetrics
    let interval: Duration
    private let position = Mutex(Position())
    private let task = Mutex<Task<Void, Never>?>(nil)
    private let logger: Logger

    init(tier: SharedCacheTier, memory: InMemoryCacheStore, metrics: CacheMetrics, interval: Duration = .milliseconds(250),
         logger: Logger) {
        self.tier = tier
        self.memory = memory
        self.metrics = metrics
        self.interval = interval
        self.logger = logger
    }

    func start() {
        task.withLock { task in
            guard task == nil else { return }
            task = Task { [self] in
                while !Task.isCancelled {
                    await poll()
                    try? await Task.sleep(for: interval)
                }
            }
        }
    }

    func stop() async {
        let running = task.withLock { task in
            defer { task = nil }
            return task
        }
        running?.cancel()
        await running?.value
    }

    /// Reads what was published since the last read and applies it. Public to tests, which poll
    /// by hand instead of waiting for the interval.
    func poll() async {
        let start = position.withLock { $0 }
        guard let lastID = start.lastID else {
            await begin()
            return
        }
        let reply: RESPValue
        do throws(RedisError) {
            reply = try await tier.backend.send(["XRANGE", .bytes(tier.eventsKey), .string("(" + lastID), "+", "COUNT", "512"])
        } catch {
            return  // counted and logged by the store; the stream keeps what this replica missed
        }
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
    private func begin() async {
        guard let reply = try? await tier.backend.send(["XREVRANGE", .bytes(tier.eventsKey), "+", "-", "COUNT", "1"]) else {
            return
        }
        let newest = Self.events(in: reply).first
        position.withLock { $0 = Position(lastID: newest?.id ?? "0-0", lastSequence: newest?.sequence) }
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
