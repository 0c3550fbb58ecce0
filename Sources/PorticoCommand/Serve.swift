import ArgumentParser
import Dispatch
import Foundation
import Logging
import Portico

#if canImport(Glibc)
import Glibc
#endif

/// Runs a gateway until SIGINT or SIGTERM; SIGHUP reloads the configuration file.
enum Serve {
    static func run(config: PorticoConfig, file: String?, logger: Logger,
                    onStart: (UInt16) async throws -> Void = { _ in }) async throws {
        let server: GatewayServer
        do {
            server = try GatewayServer(config: config, logger: logger)
            try server.start()
        } catch {
            logger.critical("cannot start", metadata: ["error": .string(String(describing: error))])
            throw ExitCode(1)
        }
        try await onStart(server.port)
        for await signal in Signals.stream([SIGINT, SIGTERM, SIGHUP]) {
            switch signal {
            case SIGHUP:
                guard let file else {
                    logger.notice("SIGHUP ignored: this configuration is embedded")
                    continue
                }
                reload(server, from: file, logger: logger)
            default:
                logger.info("shutting down", metadata: ["signal": .stringConvertible(signal)])
                await server.shutdown()
                return
            }
        }
    }

    static func reload(_ server: GatewayServer, from file: String, logger: Logger) {
        do {
            let config = try ConfigLoader.load(file: file)
            try server.reload(config)
            logger.info("configuration reloaded", metadata: ["file": .string(file)])
        } catch let error as ConfigError {
            logger.error("configuration rejected; the previous one keeps serving",
                         metadata: ["file": .string(file), "errors": .array(error.diagnostics.map { .string($0.description) })])
        } catch {
            logger.error("configuration rejected; the previous one keeps serving",
                         metadata: ["file": .string(file), "error": .string(String(describing: error))])
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
