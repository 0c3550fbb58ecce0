import Foundation
import Logging
import Metrics
import OTel
import ServiceLifecycle
import Synchronization
import Tracing

/// One `tracing:` configuration at work: swift-otel's tracer, batch span processor and OTLP/HTTP
/// exporter, running in a task of their own from `init` until `shutdown`.
///
/// The tracer is an instance, never bootstrapped into the process-wide `InstrumentationSystem`:
/// each runtime (and each gateway of a test process) has its own, and a reload that changes
/// `tracing:` builds a new one while requests in flight finish their spans on the old.
///
/// Requests never wait for the collector: a span that ends is handed to the processor's queue
/// (`max_queue_size`); a full queue drops spans, counted in `portico_trace_spans_dropped_total`.
public final class TracingPipeline: Sendable {
    public let config: TracingConfig
    let tracer: any Tracer
    private let group: ServiceGroup
    private let running: Task<Void, Never>
    private let dropCount: DropCount

    /// Spans dropped because the export queue was full, since this pipeline started.
    public var droppedSpans: Int { dropCount.value }

    /// `logger` receives swift-otel's own warnings (a failed export, dropped spans); the export
    /// headers never reach it.
    public init(config: TracingConfig, logger: Logger, metricsFactory: any MetricsFactory = MetricsSystem.factory) throws {
        self.config = config
        let dropCount = DropCount(counter: Counter(label: "portico_trace_spans_dropped_total", dimensions: [],
                                                   factory: metricsFactory))
        self.dropCount = dropCount
        var otel = OTel.Configuration.default
        otel.serviceName = config.serviceName
        otel.metrics.enabled = false
        otel.logs.enabled = false
        otel.propagators = [.traceContext]
        otel.traces.sampler = .parentBasedTraceIDRatio(ratio: config.sampleRatio) ?? .parentBasedAlwaysOn
        otel.traces.batchSpanProcessor.maxQueueSize = config.maxQueueSize
        otel.traces.batchSpanProcessor.maxExportBatchSize = min(512, config.maxQueueSize)
        otel.traces.batchSpanProcessor.scheduleDelay = config.scheduleDelay
        otel.traces.batchSpanProcessor.exportTimeout = config.timeout
        otel.traces.otlpExporter.endpoint = config.tracesURL
        otel.traces.otlpExporter.protocol = config.wireProtocol == .httpJSON ? .httpJSON : .httpProtobuf
        otel.traces.otlpExporter.headers = config.headers
        otel.traces.otlpExporter.timeout = config.timeout
        var diagnostics = logger
        diagnostics[metadataKey: "component"] = "tracing"
        otel.diagnosticLogger = .custom(Logger(label: "portico.tracing") { _ in
            TracingDiagnostics(forwardingTo: diagnostics, drops: dropCount)
        })
        otel.diagnosticLogLevel = .warning
        let service: any Service
        do {
            let backend = try OTel.makeTracingBackend(configuration: otel)
            tracer = backend.factory
            service = backend.service
        } catch {
            throw GatewayRuntime.BuildError(description: "tracing: cannot start the exporter: \(error)")
        }
        group = ServiceGroup(configuration: .init(services: [.init(service: service)], logger: diagnostics))
        let group = group
        running = Task {
            do {
                try await group.run()
            } catch {
                diagnostics.warning("tracing stopped", metadata: ["error": .string(String(describing: error))])
            }
        }
    }

    /// swift-otel's OTLP/HTTP exporter shuts its HTTP client down again when it is freed, with
    /// `syncShutdown()`, which traps on a NIO event loop thread — and in `portico` every task
    /// runs on one (NIO is the concurrency executor). The last references are let go on a
    /// thread of their own.
    deinit {
        let tracer = tracer
        let group = group
        Thread.detachNewThread {
            withExtendedLifetime((tracer, group)) {}
        }
    }

    /// Exports what is queued (within `timeout`) and stops the exporter. Idempotent.
    public func shutdown() async {
        await group.triggerGracefulShutdown()
        await running.value
    }
}

/// Dropped spans: the process-wide counter and this pipeline's own count (for tests).
final class DropCount: Sendable {
    private let counter: Counter
    private let count = Atomic<Int>(0)

    init(counter: Counter) {
        self.counter = counter
    }

    var value: Int { count.load(ordering: .relaxed) }

    func add(_ dropped: Int) {
        guard dropped > 0 else { return }
        count.add(dropped, ordering: .relaxed)
        counter.increment(by: Int64(dropped))
    }
}

/// swift-otel's diagnostic logger: its messages go to Portico's log, and the batch processor's
/// report of spans it dropped (a full queue: the collector is away or slow) is counted.
///
/// swift-otel keeps its drop count to itself and says it only in this warning (metadata
/// `dropped_count`, once per export round): the key is the contract relied on here, and
/// `TracingExportTests` fails if a swift-otel update stops saying it.
struct TracingDiagnostics: LogHandler {
    let forwardingTo: Logger
    let drops: DropCount
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .warning

    init(forwardingTo logger: Logger, drops: DropCount) {
        self.forwardingTo = logger
        self.drops = drops
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var all = metadata.merging(event.metadata ?? [:]) { _, new in new }
        if let error = event.error { all["error"] = .string(String(describing: error)) }
        if let dropped = all["dropped_count"], let count = Int(dropped.description) {
            drops.add(count)
        }
        forwardingTo.log(level: event.level, event.message, metadata: all, source: event.source,
                         file: event.file, function: event.function, line: event.line)
    }
}
