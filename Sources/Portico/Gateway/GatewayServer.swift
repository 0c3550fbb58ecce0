import Logging
import MicroHTTPD
import Synchronization

/// The running gateway: the proxy listener, the current runtime, reload and drain.
public final class GatewayServer: Sendable {
    public let gateway: Gateway
    private let server: HTTPServer
    private let logger: Logger
    private let clock: any GatewayClock
    private let listen: ListenConfig
    private let state: Mutex<(config: PorticoConfig, draining: Bool)>

    public init(config: PorticoConfig, logger: Logger, clock: any GatewayClock = SystemClock()) throws {
        let runtime = try GatewayRuntime(config: config, logger: logger, clock: clock)
        let gateway = Gateway(runtime: runtime, logger: logger, clock: clock)
        self.gateway = gateway
        self.logger = logger
        self.clock = clock
        self.listen = config.listen
        self.state = Mutex((config, false))
        server = HTTPServer(configuration: Self.serverConfiguration(config.listen, logger: logger)) { request in
            await gateway.handle(request)
        }
    }

    static func serverConfiguration(_ listen: ListenConfig, logger: Logger) -> ServerConfiguration {
        var configuration = ServerConfiguration()
        configuration.address = listen.address
        configuration.port = UInt16(clamping: listen.port)
        configuration.threads = listen.threads
        configuration.connectionLimit = listen.connectionLimit
        configuration.idleTimeout = listen.idleTimeout
        configuration.requestTimeout = listen.requestTimeout
        configuration.maxHeaderBytes = listen.maxHeaderBytes
        configuration.maxBodyBytes = listen.maxBodyBytes
        configuration.errorLog = { message in
            logger.warning("libmicrohttpd: \(message)")
        }
        configuration.errorResponse = { status, code, message in
            let error = GatewayError(status: .init(code: status), code: code, message: message)
            var response = ServerResponse(error.response(requestID: RequestID.generate()), isHead: false)
            response.closeConnection = status != 504
            return response
        }
        return configuration
    }

    /// Binds the listener; returns the bound port.
    @discardableResult
    public func start() throws -> UInt16 {
        let port = try server.start()
        logger.info("listening", metadata: ["address": .string(listen.address), "port": .stringConvertible(port)])
        return port
    }

    public var port: UInt16 { server.port }
    public var inFlightRequests: Int { server.inFlightRequests }
    public var config: PorticoConfig { state.withLock { $0.config } }
    public var isDraining: Bool { state.withLock { $0.draining } }

    /// Builds a runtime from `config` and swaps it in; the old one is released once its
    /// in-flight requests have had their request timeout to finish. Listener settings need a restart.
    public func reload(_ config: PorticoConfig) throws {
        let runtime = try GatewayRuntime(config: config, logger: logger, clock: clock)
        if config.listen != listen {
            logger.warning("listen settings changed: they take effect at the next restart")
        }
        let old = gateway.install(runtime)
        state.withLock { $0.config = config }
        let linger = listen.requestTimeout + .seconds(1)
        Task {
            try? await Task.sleep(for: linger)
            await old.shutdown()
        }
    }

    /// Graceful shutdown: after `drainDelay` stop accepting, give in-flight requests `grace`, stop.
    public func shutdown(drainDelay: Duration? = nil, grace: Duration? = nil) async {
        let alreadyDraining = state.withLock { state -> Bool in
            defer { state.draining = true }
            return state.draining
        }
        guard !alreadyDraining else { return }
        gateway.beginDraining()
        let delay = drainDelay ?? listen.drainDelay
        if delay > .zero {
            logger.info("draining: still accepting for \(delay)")
            try? await Task.sleep(for: delay)
        }
        logger.info("stopping: waiting for in-flight requests", metadata: ["in_flight": .stringConvertible(server.inFlightRequests)])
        await server.stop(grace: grace ?? listen.shutdownGrace)
        await gateway.current.shutdown()
        logger.info("stopped")
    }
}
