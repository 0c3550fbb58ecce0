import ArgumentParser
import Dispatch
import Foundation
import Logging
import Portico
import Prometheus

#if canImport(Glibc)
import Glibc
#endif

/// Runs a gateway until SIGINT or SIGTERM; SIGHUP reloads the configuration file.
enum Serve {
    static func run(config: PorticoConfig, file: String?, logger: Logger, registry: PrometheusCollectorRegistry,
                    onStart: (UInt16) async throws -> Void = { _ in }) async throws {
        let server: GatewayServer
        var admin: AdminServer?
        do {
            server = try GatewayServer(config: config, configFile: file, logger: logger)
            try server.start()
            if config.admin.enabled {
                let adminServer = AdminServer(config: config.admin, gateway: server, logger: logger) {
                    registry.emitToBuffer()
                }
                let port = try adminServer.start()
                logger.info("admin listening", metadata: ["address": .string(config.admin.address), "port": .stringConvertible(port)])
                admin = adminServer
            }
        } catch {
            logger.critical("cannot start", metadata: ["error": .string(String(describing: error))])
            throw ExitCode(1)
        }
        try await onStart(server.port)
        for await signal in Signals.stream([SIGINT, SIGTERM, SIGHUP]) {
            switch signal {
            case SIGHUP:
                // Errors are logged by the server; the old configuration keeps serving.
                try? server.reloadFromFile()
            default:
                logger.info("shutting down", metadata: ["signal": .stringConvertible(signal)])
                // /readyz turns 503 at once; the admin listener stays up until the proxy has drained.
                await server.shutdown()
                await admin?.stop()
                return
            }
        }
    }
}

/// Unix signals as an async sequence (the default handlers are disabled for those listed).
enum Signals {
    static func stream(_ signals: [Int32]) -> AsyncStream<Int32> {
        AsyncStream { continuation in
            let queue = DispatchQueue(label: "portico.signals")
            let sources = signals.map { number -> any DispatchSourceSignal in
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: queue)
                source.setEventHandler { continuation.yield(number) }
                source.resume()
                return source
            }
            let box = SourceBox(sources: sources)
            continuation.onTermination = { _ in box.cancel() }
        }
    }

    /// Keeps the dispatch sources alive while the stream is; cancelled once on termination.
    private final class SourceBox: Sendable {
        // Dispatch sources are thread-safe; the array is never mutated after init.
        nonisolated(unsafe) let sources: [any DispatchSourceSignal]
        init(sources: [any DispatchSourceSignal]) { self.sources = sources }
        func cancel() { sources.forEach { $0.cancel() } }
    }
}
