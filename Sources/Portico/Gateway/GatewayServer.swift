import Logging
import MicroHTTPD
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The running gateway: the proxy listener, the current runtime, reload and drain.
public final class GatewayServer: Sendable {
    public let gateway: Gateway
    private let server: HTTPServer
    private let logger: Logger
    private let clock: any GatewayClock
    private let listen: ListenConfig
    private let loadedConfig: Mutex<PorticoConfig>
    private let lastReloadRecord = Mutex<ReloadRecord?>(nil)
    /// Runtimes replaced by a reload, each retired by its task once its requests had their
    /// time: `shutdown` releases them at once (before the loops they use go away).
    private let retiring = Mutex<[Task<Void, Never>]>([])
    private let retiredCount = Atomic<Int>(0)
    public let metrics: GatewayMetrics
    /// The event loops, one per libmicrohttpd thread (`listen.threads`), paired by index.
    public let loops: EventLoops
    /// The file the configuration came from; `nil` for an embedded configuration (no reload).
    public let configFile: String?

    public init(config: PorticoConfig, configFile: String? = nil, logger: Logger, clock: any GatewayClock = SystemClock(),
                metrics: GatewayMetrics = GatewayMetrics()) throws {
        // One loop per daemon thread: NIO's loop count follows `listen.threads` (issue #33).
        let loops = EventLoops(count: config.listen.threads)
        let runtime: GatewayRuntime
        do {
            runtime = try GatewayRuntime(config: config, logger: logger, clock: clock, loops: loops)
        } catch {
            let loops = loops
            Task { await loops.shutdown() }
            throw error
        }
        let gateway = Gateway(runtime: runtime, logger: logger, clock: clock, metrics: metrics,
                              scheme: config.listen.tls == nil ? "http" : "https", threads: loops.count,
                              defaultWebsocketLimit: Self.defaultWebsocketLimit(config, logger: logger))
        self.loops = loops
        self.metrics = metrics
        self.configFile = configFile
        self.gateway = gateway
        self.logger = logger
        self.clock = clock
        self.listen = config.listen
        self.loadedConfig = Mutex(config)
        server = HTTPServer(configuration: Self.serverConfiguration(config.listen, logger: logger, gateway: gateway,
                                                                    loops: loops),
                            answering: gateway.answer)
    }

    static func serverConfiguration(_ listen: ListenConfig, logger: Logger, gateway: Gateway,
                                    loops: EventLoops) -> ServerConfiguration {
        var configuration = ServerConfiguration()
        configuration.address = listen.address
        configuration.port = UInt16(clamping: listen.port)
        // Daemon thread i starts its requests' tasks on loop i.
        configuration.threads = loops.count
        configuration.taskExecutors = loops.executors
        configuration.connectionLimit = connectionLimit(listen.connectionLimit, logger: logger)
        configuration.idleTimeout = listen.idleTimeout
        configuration.headerTimeout = listen.headerTimeout
        configuration.requestTimeout = listen.requestTimeout
        configuration.maxHeaderBytes = listen.maxHeaderBytes
        configuration.maxBodyBytes = listen.maxBodyBytes
        configuration.bufferedBodyBytes = listen.bufferRequestBody
        configuration.tls = listen.tls.map {
            ServerConfiguration.TLS(certificatePEM: $0.certificatePEM, privateKeyPEM: $0.privateKeyPEM)
        }
        configuration.errorLog = { message in
            logger.warning("libmicrohttpd: \(message)")
        }
        configuration.refusalResponse = { refusal, request, requestID in
            // Refused as its head was read: logged and counted like any request answered before a chain.
            if let request { return gateway.refused(request, refusal) }
            let error = GatewayError(refusal)
            let requestID = requestID ?? RequestID.generate()
            var response = ServerResponse(error.response(requestID: requestID), isHead: false, requestID: requestID)
            response.closeConnection = refusal != .deadlineExceeded
            return response
        }
        return configuration
    }

    /// `configured`, or when unset the default sized to the hard descriptor limit (said at info).
    static func connectionLimit(_ configured: Int?, logger: Logger) -> Int {
        let descriptorLimit = hardDescriptorLimit()
        let chosen = ConnectionLimitSizing.connectionLimit(configured: configured, descriptorLimit: descriptorLimit)
        if configured == nil {
            logger.info("listen.connection_limit not set: \(chosen) connections", metadata: [
                "descriptor_limit": .string(descriptorLimit.map(String.init) ?? "unlimited"),
                "descriptors_needed": .stringConvertible(ConnectionLimitSizing.descriptorsNeeded(connectionLimit: chosen)),
            ])
        }
        return chosen
    }

    /// The hard limit on open descriptors; nil when unknown or unlimited.
    static func hardDescriptorLimit() -> UInt64? {
        var limit = rlimit()
        let known = getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit) == 0 && limit.rlim_max != rlim_t.max  // RLIM_INFINITY
        return known ? UInt64(limit.rlim_max) : nil
    }

    /// The session cap when `listen.max_websockets` is not set (0: none), said at info when a
    /// route opts in to upgrades.
    static func defaultWebsocketLimit(_ config: PorticoConfig, logger: Logger) -> Int {
        let descriptorLimit = hardDescriptorLimit()
        let tls = config.listen.tls != nil
        let chosen = ConnectionLimitSizing.websocketLimit(descriptorLimit: descriptorLimit, tls: tls)
        if config.listen.maxWebsockets == 0, config.routes.contains(where: { !$0.upgrade.isEmpty }) {
            logger.info("listen.max_websockets not set: \(chosen == 0 ? "no cap but connection_limit" : "\(chosen) sessions")", metadata: [
                "descriptor_limit": .string(descriptorLimit.map(String.init) ?? "unlimited"),
                "descriptors_per_session": .stringConvertible(ConnectionLimitSizing.descriptorsPerSession(tls: tls)),
            ])
        }
        return chosen
    }

    /// Binds the listener; returns the bound port.
    @discardableResult
    public func start() throws -> UInt16 {
        if !HTTPServer.upgradeSupported, let route = config.routes.first(where: { !$0.upgrade.isEmpty }) {
            // Checked at start (MHD_FEATURE_UPGRADE): such a handshake would be answered 500.
            logger.error("this libmicrohttpd was built without upgrade support: WebSocket handshakes cannot be relayed",
                         metadata: ["route": .string(route.name)])
        }
        let port = try server.start()
        logger.info("listening", metadata: ["address": .string(listen.address), "port": .stringConvertible(port),
                                            "tls": .stringConvertible(listen.tls != nil),
                                            "threads": .stringConvertible(server.threads)])
        return port
    }

    public var port: UInt16 { server.port }
    public var inFlightRequests: Int { server.inFlightRequests }
    public var config: PorticoConfig { loadedConfig.withLock { $0 } }
    /// From the first shutdown signal on (`/readyz` answers 503).
    public var isDraining: Bool { server.lifecycle >= .draining }

    /// The last reload of the configuration file and how it ended; `nil` before any.
    public var lastReload: ReloadRecord? { lastReloadRecord.withLock { $0 } }

    /// Why a reload was refused.
    public struct ReloadError: Error, CustomStringConvertible {
        public var messages: [String]
        public var description: String { messages.joined(separator: "\n") }
    }

    /// Re-reads the configuration file and swaps it in; on any error the current one keeps serving.
    public func reloadFromFile() throws(ReloadError) {
        guard let configFile else {
            throw ReloadError(messages: ["this configuration is embedded: there is no file to reload"])
        }
        do {
            let config = try ConfigLoader.load(file: configFile)
            try reload(config)
            metrics.configReloaded(result: "success")
            lastReloadRecord.withLock { $0 = ReloadRecord(ok: true) }
            logger.info("configuration reloaded", metadata: ["file": .string(configFile)])
        } catch {
            metrics.configReloaded(result: "failure")
            let messages = (error as? ConfigError)?.diagnostics.map(\.description) ?? [String(describing: error)]
            lastReloadRecord.withLock { $0 = ReloadRecord(ok: false, errors: messages) }
            logger.error("configuration rejected; the previous one keeps serving",
                         metadata: ["file": .string(configFile), "errors": .array(messages.map { .string($0) })])
            throw ReloadError(messages: messages)
        }
    }

    /// Runtimes replaced by reloads and retired since start (for tests and operators).
    public var runtimesRetired: Int { retiredCount.load(ordering: .relaxed) }

    /// Builds a runtime from `config` and swaps it in; the old one is retired once its
    /// in-flight requests have had their request timeout to finish (`GatewayRuntime.retire`:
    /// response streams still flowing then are not cut). Listener settings need a restart.
    public func reload(_ config: PorticoConfig) throws {
        // Unchanged credentials carry their tokens over to the new runtime.
        let runtime = try GatewayRuntime(config: config, logger: logger, clock: clock, loops: loops,
                                         previous: gateway.current)
        if config.listen != listen {
            logger.warning("listen settings changed: they take effect at the next restart")
        }
        let old = gateway.install(runtime)
        loadedConfig.withLock { $0 = config }
        let linger = listen.requestTimeout + .seconds(1)
        // Cancelled by `shutdown`: the sleep ends at once and the runtime is shut down then
        // (its requests have ended: the server stopped first).
        let release = Task { [self] in
            do {
                try await clock.sleep(for: linger)
                await old.retire()
                retiredCount.add(1, ordering: .relaxed)
            } catch {
                await old.shutdown()
            }
        }
        retiring.withLock { $0.append(release) }
    }

    /// Graceful shutdown: after `drainDelay` stop accepting, give in-flight requests `grace`, stop.
    public func shutdown(drainDelay: Duration? = nil, grace: Duration? = nil) async {
        // The first call drains and stops; later ones (a second signal) return at once.
        guard server.beginDraining() else {
            // Never started: only the runtime's connections and the loops to release.
            if server.lifecycle == .created {
                await gateway.current.shutdown()
                await loops.shutdown()
            }
            return
        }
        let delay = drainDelay ?? listen.drainDelay
        if delay > .zero {
            logger.info("draining: still accepting for \(delay)")
            try? await Task.sleep(for: delay)
        }
        logger.info("stopping: waiting for in-flight requests", metadata: ["in_flight": .stringConvertible(server.inFlightRequests)])
        await server.stop(grace: grace ?? listen.shutdownGrace)
        let retired = retiring.withLock { retiring in
            defer { retiring = [] }
            return retiring
        }
        for release in retired { release.cancel() }
        for release in retired { await release.value }
        await gateway.current.shutdown()
        await loops.shutdown()
        logger.info("stopped")
    }
}
