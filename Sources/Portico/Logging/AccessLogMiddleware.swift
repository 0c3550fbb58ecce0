import HTTPTypes
import Logging

/// One structured line per request: who asked what, what came back, and how long it took.
/// Placed outermost, it sees what inner middleware recorded in `context.stats`.
public struct AccessLogMiddleware: ImmediateMiddleware {
    let settings: AccessLogConfig
    let logger: Logger
    let clock: any GatewayClock
    private let redactHeaders: Set<String>
    private let redactQuery: Set<String>

    public init(_ settings: AccessLogConfig, logger: Logger, clock: any GatewayClock) {
        self.settings = settings
        var accessLogger = logger
        accessLogger[metadataKey: "log"] = "access"
        self.logger = accessLogger
        self.clock = clock
        redactHeaders = Set(settings.redactHeaders.map { $0.lowercased() })
        redactQuery = Set(settings.redactQuery)
    }

    public func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
        let start = clock.now
        let outcome: Result<GatewayResponse, any Error>
        do {
            outcome = .success(try await next(request, context))
        } catch {
            outcome = .failure(error)
        }
        return try logged(outcome, request: request, context: context, start: start)
    }

    public func handleImmediately(_ request: GatewayRequest, context: RequestContext,
                                  next: ImmediateNextHandler) throws -> GatewayResponse? {
        let start = clock.now
        let outcome: Result<GatewayResponse, any Error>
        do {
            guard let response = try next(request, context) else { return nil }
            outcome = .success(response)
        } catch {
            outcome = .failure(error)
        }
        return try logged(outcome, request: request, context: context, start: start)
    }

    /// Logs the line for `outcome` and passes it on.
    private func logged(_ outcome: Result<GatewayResponse, any Error>, request: GatewayRequest, context: RequestContext,
                        start: ContinuousClock.Instant) throws -> GatewayResponse {
        switch outcome {
        case .success(let response):
            log(request, context: context, status: response.status.code, bytesOut: response.body.count ?? 0,
                error: nil, start: start)
            return response
        case .failure(let error as GatewayError):
            log(request, context: context, status: error.status.code, bytesOut: 0, error: error.kind.name, start: start)
            throw error
        case .failure(let error):
            log(request, context: context, status: 500, bytesOut: 0, error: GatewayError.Kind.internalError.name, start: start)
            throw error
        }
    }

    private func log(_ request: GatewayRequest, context: RequestContext, status: Int, bytesOut: Int,
                     error: String?, start: ContinuousClock.Instant) {
        let stats = context.stats.snapshot
        var metadata: Logger.Metadata = [
            "request_id": .string(context.requestID),
            "client": .string(request.clientAddress),
            "method": .string(request.method.rawValue),
            "path": .string(redactedTarget(request)),
            "status": .stringConvertible(status),
            "bytes_in": .stringConvertible(request.body.count ?? 0),
            "bytes_out": .stringConvertible(bytesOut),
            "duration_ms": .string(Self.milliseconds(start.duration(to: clock.now))),
        ]
        if let route = context.route { metadata["route"] = .string(route) }
        if let upstream = context.upstream { metadata["upstream"] = .string(upstream) }
        if stats.attempts > 0 {
            metadata["upstream_ms"] = .string(Self.milliseconds(stats.upstreamDuration))
            metadata["attempts"] = .stringConvertible(stats.attempts)
            metadata["retries"] = .stringConvertible(max(0, stats.attempts - 1))
        }
        if let cache = stats.cacheStatus { metadata["cache"] = .string(cache) }
        if let credential = stats.credential { metadata["credential"] = .string(credential) }
        if let error { metadata["error"] = .string(error) }
        for (key, value) in stats.extra { metadata[key] = .string(value) }
        for name in settings.includeHeaders {
            guard let fieldName = HTTPField.Name(name) else { continue }
            let values = request.headerFields[values: fieldName]
            guard !values.isEmpty else { continue }
            let key = "header_" + name.lowercased().replacingOccurrences(of: "-", with: "_")
            metadata[key] = .string(redactHeaders.contains(name.lowercased()) ? "[REDACTED]" : values.joined(separator: ", "))
        }
        logger.info("request", metadata: metadata)
    }

    /// The target with configured query parameters' values replaced.
    func redactedTarget(_ request: GatewayRequest) -> String {
        guard let query = request.query, !redactQuery.isEmpty else { return request.target }
        let parts = query.split(separator: "&", omittingEmptySubsequences: false).map { pair -> Substring in
            let name = pair.split(separator: "=", maxSplits: 1).first ?? pair
            return redactQuery.contains(String(name)) ? name + "=[REDACTED]" : pair
        }
        return String(request.path) + "?" + parts.joined(separator: "&")
    }

    static func milliseconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        let micros = seconds * 1_000_000 + attoseconds / 1_000_000_000_000
        let whole = micros / 1000
        let fraction = abs(micros % 1000)
        let text = String(fraction)
        return "\(whole).\(String(repeating: "0", count: 3 - text.count))\(text)"
    }
}
