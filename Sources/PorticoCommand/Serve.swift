import ArgumentParser
import Foundation
import LockAudit
import Logging
import Portico
import ServiceLifecycle
import UnixSignals

/// Runs a gateway until SIGINT or SIGTERM; SIGHUP reloads the configuration file.
///
/// The proxy and admin listeners are services of one `ServiceGroup`, which turns SIGINT and
/// SIGTERM into a graceful shutdown of each in reverse order: the proxy drains first (`/readyz`
/// answers 503 from the first moment), and the admin listener stops only once it has. The
/// listeners bind inside their services, after the group traps the signals, so a SIGTERM that
/// arrives during startup is a graceful shutdown too.
enum Serve {
    static func run(config: PorticoConfig, file: String?, logger: Logger, registry: MetricsExposition,
                    onStart: @escaping @Sendable (UInt16) async throws -> Void = { _ in }) async throws {
        // The confinement test (issue #33): with PORTICO_LOCK_AUDIT=FILE every lock made from here
        // on records the threads that take it, and the report is written to FILE at exit.
        let lockAudit = ProcessInfo.processInfo.environment["PORTICO_LOCK_AUDIT"].flatMap { $0.isEmpty ? nil : $0 }
        if lockAudit != nil { LockAudit.start() }
        defer {
            if let lockAudit {
                LockAudit.stop()
                try? LockAudit.reportJSON().write(toFile: lockAudit, atomically: true, encoding: .utf8)
            }
        }
        let server: GatewayServer
        do {
            server = try GatewayServer(config: config, configFile: file, logger: logger)
        } catch {
            logger.critical("cannot start", metadata: ["error": .string(String(describing: error))])
            throw ExitCode(1)
        }
        var services: [any Service] = []
        if config.admin.enabled {
            let admin = AdminServer(config: config.admin, gateway: server, logger: logger) { registry.render() }
            services.append(AdminService(admin: admin, address: config.admin.address, logger: logger))
        }
        services.append(ProxyService(server: server, logger: logger, onStart: onStart))
        let group = ServiceGroup(configuration: .init(services: services.map { .init(service: $0) },
                                                      gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        do {
            try await group.run()
        } catch {
            logger.critical("cannot start", metadata: ["error": .string(String(describing: error))])
            // Whatever started is stopped, and the upstream clients are shut down before exiting.
            await server.shutdown(drainDelay: .zero, grace: .zero)
            throw ExitCode(1)
        }
    }
}

/// The proxy listener: binds, reloads on SIGHUP until a graceful shutdown, then drains and stops.
struct ProxyService: Service {
    let server: GatewayServer
    let logger: Logger
    let onStart: @Sendable (UInt16) async throws -> Void

    func run() async throws {
        let port = try server.start()
        try await onStart(port)
        for await _ in await UnixSignalsSequence(trapping: .sighup).cancelOnGracefulShutdown() {
            // Errors are logged by the server; the old configuration keeps serving.
            try? server.reloadFromFile()
        }
        logger.info("shutting down")
        // In a task of its own: the drain's waits must run their course even when the group
        // cancels this service (another service failed to start).
        await Task { await server.shutdown() }.value
    }
}

/// The admin listener: binds, and stays up until the group shuts it down, after the proxy has drained.
struct AdminService: Service {
    let admin: AdminServer
    let address: String
    let logger: Logger

    func run() async throws {
        let port = try admin.start()
        logger.info("admin listening", metadata: ["address": .string(address), "port": .stringConvertible(port)])
        try? await gracefulShutdown()
        await admin.stop()
    }
}
