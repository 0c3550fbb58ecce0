import Logging
import Synchronization

/// Keeps the metadata of log events with one message (e.g. the access log's "request"), so
/// tests read what the gateway logged instead of parsing output.
public final class LogCapture: Sendable {
    private let message: String
    private let minimumLevel: Logger.Level
    private let lines = Mutex<[Logger.Metadata]>([])

    public init(message: String, minimumLevel: Logger.Level = .trace) {
        self.message = message
        self.minimumLevel = minimumLevel
    }

    /// A logger whose events with `message` at `minimumLevel` or above are kept.
    public var logger: Logger {
        Logger(label: "portico.tests.capture") { _ in Handler(capture: self) }
    }

    public var records: [Logger.Metadata] { lines.withLock { $0 } }

    struct Handler: LogHandler {
        let capture: LogCapture
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace

        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }

        func log(event: LogEvent) {
            guard event.message.description == capture.message, event.level >= capture.minimumLevel else { return }
            let merged = metadata.merging(event.metadata ?? [:]) { $1 }
            capture.lines.withLock { $0.append(merged) }
        }
    }
}
