import Foundation
import Logging

/// An upstream's endpoints at one moment and their columns in the loops' rows (a column stays an
/// endpoint's while it is in a set or draining, so its requests in flight stay counted there).
final class EndpointSet: Sendable {
    let endpoints: [EndpointState]
    let columns: [Int]
    let allMask: UInt64

    init(_ endpoints: [EndpointState], columns: [Int]) {
        self.endpoints = endpoints
        self.columns = columns
        allMask = endpoints.count == 64 ? .max : (UInt64(1) << UInt64(endpoints.count)) - 1
    }
}

/// `dns_refresh`: the owner of a resolved upstream's endpoints. It resolves the name at start and
/// every `dns_refresh` on the injected clock; a changed answer changes the set (new addresses take
/// traffic at once, removed ones drain: their exchanges in flight finish on them); a failed or
/// empty one keeps the last good set.
///
/// Each loop reads the set from its own slot (a lock only that loop takes per request); a changed
/// answer writes every slot once.
final class EndpointResolution: Sendable {
    /// Removed endpoints kept open for their exchanges in flight, at most (the oldest beyond are shut down).
    static let maxDraining = UpstreamConfig.maxEndpoints
    /// Row columns a resolved upstream needs: its endpoints and the draining ones.
    static let columns = UpstreamConfig.maxEndpoints + maxDraining

    let host: String
    private let refresh: Duration
    private let resolver: any EndpointResolver
    private let config: UpstreamConfig
    private let clock: any GatewayClock
    private let logger: Logger
    private let makeEndpoint: @Sendable (URL, UpstreamConfig) -> EndpointState
    /// One per row, read per request by its own loop.
    private let slots: [Slot]

    private final class Slot: Sendable {
        let set: Mutex<EndpointSet>
        init(_ set: EndpointSet) { self.set = Mutex(set) }
    }

    private struct State {
        /// Removed endpoints, oldest first, with their columns.
        var draining: [(endpoint: EndpointState, column: Int)] = []
        var task: Task<Void, Never>?
    }
    private let state = Mutex(State())

    /// `initial`: the set until the first answer. `rows`: one slot each. `makeEndpoint`: a new
    /// endpoint (client, metrics) at a URL with its transport settings.
    init(host: String, refresh: Duration, resolver: any EndpointResolver, config: UpstreamConfig, initial: EndpointSet,
         rows: Int, clock: any GatewayClock, logger: Logger,
         makeEndpoint: @escaping @Sendable (URL, UpstreamConfig) -> EndpointState) {
        self.host = host
        self.refresh = refresh
        self.resolver = resolver
        self.config = config
        self.clock = clock
        self.logger = logger
        self.makeEndpoint = makeEndpoint
        slots = (0..<rows).map { _ in Slot(initial) }
    }

    /// The set a request on row `row` sees.
    @inline(__always)
    func set(row: Int) -> EndpointSet {
        slots[row].set.withLock { $0 }
    }

    /// Resolves now and every `dns_refresh` until `stop`; `changed` hears of each change
    /// (endpoints added, endpoints removed).
    func start(changed: @escaping @Sendable (_ added: [EndpointState], _ removed: [EndpointState]) -> Void) {
        let task = Task {
            while !Task.isCancelled {
                if let change = await self.resolveOnce() { changed(change.added, change.removed) }
                do {
                    try await self.clock.sleep(for: self.refresh)
                } catch {
                    return
                }
            }
        }
        state.withLock { $0.task = task }
    }

    /// Stops resolving (waits for the task) and hands back the draining endpoints, which this no
    /// longer keeps.
    func stop() async -> [EndpointState] {
        let task = state.withLock { state in
            defer { state.task = nil }
            return state.task
        }
        task?.cancel()
        await task?.value
        return state.withLock { state in
            defer { state.draining = [] }
            return state.draining.map(\.endpoint)
        }
    }

    /// One resolution; the change it made, if any.
    func resolveOnce() async -> (added: [EndpointState], removed: [EndpointState])? {
        let addresses: [String]
        do {
            addresses = try await resolver.resolve(host)
        } catch {
            logger.warning("upstream name not resolved: keeping its endpoints", metadata: [
                "upstream": "\(config.name)", "host": "\(host)", "error": "\(error)",
            ])
            return nil
        }
        guard !addresses.isEmpty else {
            logger.warning("upstream name resolved to no address: keeping its endpoints", metadata: [
                "upstream": "\(config.name)", "host": "\(host)",
            ])
            return nil
        }
        return apply(addresses)
    }

    private func apply(_ addresses: [String]) -> (added: [EndpointState], removed: [EndpointState])? {
        let target = UpstreamTarget(baseURL: config.url)
        let scheme = config.url.scheme?.lowercased() ?? "http"
        let port = config.url.port ?? (scheme == "https" ? 443 : 80)
        var wanted: [(address: String, url: URL)] = []
        for ip in addresses.prefix(UpstreamConfig.maxEndpoints) {
            let host = ip.contains(":") ? "[\(ip)]" : ip
            guard let url = URL(string: "\(scheme)://\(host):\(port)\(target.basePath)") else { continue }
            wanted.append((UpstreamTarget(baseURL: url).authority, url))
        }
        let (added, removed, evicted) = state.withLock { state -> ([EndpointState], [EndpointState], [EndpointState]) in
            let current = set(row: slots.count - 1)
            if current.endpoints.map(\.address) == wanted.map(\.address) { return ([], [], []) }
            var kept: [String: (EndpointState, Int)] = [:]
            for (endpoint, column) in zip(current.endpoints, current.columns) { kept[endpoint.address] = (endpoint, column) }
            let stay = Set(wanted.map(\.address))
            var removed: [EndpointState] = []
            for (endpoint, column) in zip(current.endpoints, current.columns) where !stay.contains(endpoint.address) {
                state.draining.append((endpoint, column))
                removed.append(endpoint)
            }
            var evicted: [EndpointState] = []
            while state.draining.count > Self.maxDraining {
                evicted.append(state.draining.removeFirst().endpoint)
            }
            var used = Set(state.draining.map(\.column))
            for (address, entry) in kept where stay.contains(address) { used.insert(entry.1) }
            var endpoints: [EndpointState] = [], columns: [Int] = [], added: [EndpointState] = []
            for (address, url) in wanted {
                if let (endpoint, column) = kept[address] {
                    endpoints.append(endpoint)
                    columns.append(column)
                    continue
                }
                guard let column = (0..<Self.columns).first(where: { !used.contains($0) }) else { continue }
                used.insert(column)
                var own = BalancedUpstream.endpointConfig(config, url: url)
                // The upstream still hears its name: `Host`, and TLS checks the certificate for it.
                own.requestAuthority = target.authority
                if scheme == "https", own.tls.serverName == nil { own.tls.serverName = self.host }
                let endpoint = makeEndpoint(url, own)
                endpoints.append(endpoint)
                columns.append(column)
                added.append(endpoint)
            }
            let set = EndpointSet(endpoints, columns: columns)
            for slot in slots { slot.set.withLock { $0 = set } }
            return (added, removed, evicted)
        }
        guard !added.isEmpty || !removed.isEmpty else { return nil }
        logger.info("upstream endpoints changed", metadata: [
            "upstream": "\(config.name)", "added": "\(added.map { $0.address })", "removed": "\(removed.map { $0.address })",
        ])
        if !evicted.isEmpty {
            Task { for endpoint in evicted { await endpoint.client.shutdown() } }
        }
        return (added, removed)
    }
}
