import ArgumentParser
import Logging
import Portico
import Prometheus
import ServiceLifecycle
import UnixSignals

/// Runs a gateway until SIGINT or SIGTERM; SIGHUP reloads the configuration file.
///
/// The proxy and admin listeners are services of one `ServiceGroup`, which turns SIGINT and
/// SIGTERM into a graceful shutdown of each in reverse order: the proxy drains first (`/readyz`
/// answers 503 from the first moment), and the admin listener stops only once it has.
enum Serve {
    static func run(config: PorticoConfig, file: String?, logger: Logger, registry: PrometheusCollectorRegistry,
                    onStart: (UInt16) async throws -> Void = { _ in }) async throws {
        var services: [any Service] = []
        let server: GatewayServer
        do {
            server = try GatewayServer(config: config, configFile: file, logger: logger)
        } catch {
            logger.critical("cannot start", metadata: ["error": .string(String(describing: error))])
            throw ExitCode(1)
        }
        do {
            try server.start()
            if config.admin.enabled {
                let admin = AdminServer(config: config.admin, gateway: server, logger: logger) {
                    registry.emitToBuffer()
                }
                let port = try admin.start()
                logger.info("admin listening", metadata: ["address": .string(config.admin.address), "port": .stringConvertible(port)])
                services.append(AdminService(admin: admin))
            }
        } catch {
            logger.critical("cannot start", metadata: ["error": .string(String(describing: error))])
            // Whatever started is stopped, and the upstream clients are shut down before exiting.
            await server.shutdown(drainDelay: .zero, grace: .zero)
            throw ExitCode(1)
        }
        services.append(ProxyService(server: server, logger: logger))
        try await onStart(server.port)
        let group = ServiceGroup(configuration: .init(services: services.map { .init(service: $0) },
                                                      gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
    }
}

/// The proxy listener: reloads on SIGHUP until a graceful shutdown, then drains and stops.
struct ProxyService: Service {
    let server: GatewayServer
    let logger: Logger

    func run() async throws {
        for await _ in await UnixSignalsSequence(trapping: .sighup).cancelOnGracefulShutdown() {
            // Errors are logged by the server; the old configuration keeps serving.
            try? server.reloadFromFile()
        }
        logger.info("shutting down")
        await server.shutdown()
    }
}

/// The admin listener: stays up until the group shuts it down, after the proxy has drained.
struct AdminService: Service {
    let admin: AdminServer

    func run() async throws {
        try? await gracefulShutdown()
        await admin.stop()
    }
}
