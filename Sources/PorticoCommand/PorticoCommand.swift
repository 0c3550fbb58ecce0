import ArgumentParser
import Foundation
import Logging
import Metrics
import Portico
import Prometheus

struct PorticoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "portico",
        abstract: "An HTTP gateway sidecar: credentials, access logs, caching, retries and rate limits in front of your upstream APIs.",
        version: PorticoVersion.string,
        subcommands: [Run.self, Check.self, Explain.self, Schema.self, Demo.self, Version.self],
        defaultSubcommand: nil
    )
}

struct ConfigOption: ParsableArguments {
    @Option(name: [.short, .long], help: "The YAML configuration file.")
    var config: String = "config/portico.yaml"

    /// Loads the file; on errors prints every diagnostic to stderr and exits 1.
    func load() throws -> PorticoConfig {
        try Bootstrap.loadOrExit("") { () throws(ConfigError) in try ConfigLoader.load(file: config) }
    }
}

struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Serve with a configuration file.")

    @OptionGroup var options: ConfigOption

    func run() async throws {
        let config = try options.load()
        Bootstrap.logging(config.logging)
        let registry = Bootstrap.metrics()
        let logger = Logger(label: "portico")
        try await Serve.run(config: config, file: options.config, logger: logger, registry: registry)
    }
}

struct Check: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Validate a configuration file without serving (exit 0 valid, 1 invalid).")

    @OptionGroup var options: ConfigOption

    func run() async throws {
        let config = try options.load()
        // Build the runtime too: everything that would fail at start fails here.
        do {
            let runtime = try GatewayRuntime(config: config, logger: Logger(label: "portico.check", factory: { _ in SwiftLogNoOpLogHandler() }))
            await runtime.shutdown()
        } catch {
            FileHandle.standardError.write(Data("\(options.config): \(error)\n".utf8))
            throw ExitCode(1)
        }
        for warning in config.warnings {
            FileHandle.standardError.write(Data("warning: \(warning.description)\n".utf8))
        }
        print("\(options.config): OK (\(config.summary))")
    }
}

struct Version: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print the version.")

    func run() {
        print("portico \(PorticoVersion.string)")
    }
}

enum Bootstrap {
    /// Runs a config load; a `ConfigError` is printed (all diagnostics) and becomes exit code 1.
    static func loadOrExit(_ prefix: String, _ load: () throws(ConfigError) -> PorticoConfig) throws -> PorticoConfig {
        do {
            return try load()
        } catch {
            FileHandle.standardError.write(Data("\(prefix)\(error.description)\n".utf8))
            throw ExitCode(1)
        }
    }

    /// swift-metrics is bootstrapped exactly once, here, with the Prometheus backend behind a
    /// `ShardedMetricsFactory`: requests record into per-thread cells, merged into the registry
    /// (counters, meters) or rendered beside it (histograms) when the admin listener reads them.
    static func metrics() -> MetricsExposition {
        let registry = PrometheusCollectorRegistry()
        var prometheus = PrometheusMetricsFactory(registry: registry)
        prometheus.defaultDurationHistogramBuckets = GatewayMetrics.requestDurationBuckets
        let factory = sharded(prometheus)
        MetricsSystem.bootstrap(factory)
        return MetricsExposition(registry: registry, factory: factory)
    }

    /// A sharding factory over `prometheus`, with its histogram buckets.
    static func sharded(_ prometheus: PrometheusMetricsFactory) -> ShardedMetricsFactory {
        ShardedMetricsFactory(base: prometheus, buckets: .init(
            defaultDuration: prometheus.defaultDurationHistogramBuckets, duration: prometheus.durationHistogramBuckets,
            defaultValue: prometheus.defaultValueHistogramBuckets, value: prometheus.valueHistogramBuckets))
    }

    /// swift-log is bootstrapped exactly once, here, from the configuration's logging section.
    static func logging(_ settings: LoggingConfig) {
        LoggingSystem.bootstrap { label in
            StructuredLogHandler(label: label, format: settings.format, level: settings.level)
        }
    }
}

/// What `/metrics` (and `/stats`, which reads it) renders: the registry's text, with the
/// per-thread counts merged in first and the sharded histograms after it.
struct MetricsExposition: Sendable {
    let registry: PrometheusCollectorRegistry
    let factory: ShardedMetricsFactory

    func render() -> [UInt8] {
        factory.exposition { registry.emitToBuffer() }
    }
}
