import HTTPTypes
import Logging
import MicroHTTPD

/// One structured line per request: who asked what, what came back, and how long it took.
/// Placed outermost, it sees what inner middleware recorded in `context.stats`. A streamed
/// response's line is written when its body ends (`ended`, the bytes that left, `ttfb_ms` to
/// its first body byte); a buffered one's when it is returned.
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
        var request = request
        // A streamed upload's bytes_in is what was read of it, counted as it is read.
        var uploadCounter: StreamObserver?
        if request.body.isStreamed {
            let counter = StreamObserver(clock: clock)
            request.body.append(counter, keepsLength: true)
            uploadCounter = counter
        }
        let outcome: Result<GatewayResponse, any Error>
        do {
            outcome = .success(try await next(request, context))
        } catch {
            outcome = .failure(error)
        }
        return try logged(outcome, request: request, context: context, start: start, uploadCounter: uploadCounter)
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

    /// Logs the line for `outcome` and passes it on: at once for a buffered answer, when the
    /// body ends for a streamed one (a stage counts what leaves, after inner stages such as
    /// compression).
    private func logged(_ outcome: Result<GatewayResponse, any Error>, request: GatewayRequest, context: RequestContext,
                        start: ContinuousClock.Instant, uploadCounter: StreamObserver? = nil) throws -> GatewayResponse {
        // HEAD answers carry no body, whatever the response holds.
        let sendsBody = request.method != .head
        switch outcome {
        case .success(var response):
            if let tunnel = response.tunnel {
                // An upgraded session: its one line is written when it ends, with the bytes each
                // way (`bytes_in` from the client, `bytes_out` to it), its duration and how it ended.
                let head = GatewayRequest(head: request.head, body: .empty, clientAddress: request.clientAddress,
                                          version: request.version)
                let status = response.status.code
                let handshake = start.duration(to: clock.now)
                tunnel.onEnd { [self] summary in
                    log(head, context: context, status: status, bytesIn: summary.bytesFromClient,
                        bytesOut: summary.bytesFromUpstream, error: nil,
                        timing: Timing(ttfb: handshake, duration: handshake + summary.duration, ended: .complete,
                                       session: summary.reason))
                }
                return response
            }
            guard sendsBody, response.body.isStreamed else {
                let now = clock.now
                log(request, context: context, status: response.status.code, bytesIn: uploadCounter?.bytes,
                    bytesOut: sendsBody ? response.body.count ?? 0 : 0, error: nil,
                    timing: Timing(ttfb: start.duration(to: now), duration: start.duration(to: now), ended: .complete))
                return response
            }
            let status = response.status.code
            // The request's head only: the stage must not keep the upload's stream alive.
            let head = GatewayRequest(head: request.head, body: request.body.isStreamed ? .empty : request.body,
                                      clientAddress: request.clientAddress, version: request.version)
            response.body.append(StreamObserver(clock: clock, onEnd: { [self] seen in
                log(head, context: context, status: status, bytesIn: uploadCounter?.bytes, bytesOut: seen.bytes,
                    error: seen.error?.kind.name,
                    timing: Timing(ttfb: seen.firstByte.map { start.duration(to: $0) }
                                       ?? (seen.ending == .complete ? start.duration(to: seen.end) : nil),
                                   duration: start.duration(to: seen.end), ended: seen.ending))
            }), keepsLength: true)
            return response
        case .failure(let error):
            // What the gateway answers for it, as the client gets it (the JSON error body).
            let answer = GatewayError.answering(error)
            let bytesOut = sendsBody ? answer.response(requestID: context.requestID).body.count ?? 0 : 0
            let now = clock.now
            log(request, context: context, status: answer.status.code, bytesIn: uploadCounter?.bytes, bytesOut: bytesOut,
                error: answer.kind.name,
                timing: Timing(ttfb: start.duration(to: now), duration: start.duration(to: now), ended: .complete))
            throw error
        }
    }

    /// When the answer went out and how it ended: `ttfb_ms` (to the first body byte of a
    /// streamed response, to the head of a buffered one), `duration_ms` (to the end of the
    /// body), `ended`.
    private struct Timing {
        var ttfb: Duration?
        var duration: Duration
        var ended: StreamEnding
        /// For an upgraded session: how it ended, written as `ended` instead.
        var session: UpgradeEndReason? = nil
    }

    /// `bytesIn`: what was read of a streamed upload; `nil` for the request body's own length.
    private func log(_ request: GatewayRequest, context: RequestContext, status: Int, bytesIn: Int?, bytesOut: Int,
                     error: String?, timing: Timing) {
        let stats = context.stats.snapshot
        // `upstream` names the upstream that was asked: a refusal (`rate_limit`'s 429, a missing
        // credential) or a cache hit answered before any attempt names none.
        write(LineRequest(method: request.method.rawValue, target: request.target, client: request.clientAddress,
                          bytesIn: bytesIn ?? request.body.count ?? 0, headerValues: { request.headerFields[values: $0] }),
              requestID: context.requestID, route: context.route, upstream: stats.attempts > 0 ? context.upstream : nil,
              stats: stats, status: status, bytesOut: bytesOut, error: error, timing: timing)
    }

    /// The line for a request the gateway answered before any route's chain ran: refused as its
    /// head was read (`431`, `413`, framing `400`), malformed (`400`), no route (`404`, `route`
    /// empty), method not allowed (`405`), overloaded (`503`). `serverRequest` is what the
    /// client sent, as received. No upstream was asked, so the line names none.
    public func logAnswered(_ serverRequest: ServerRequest, requestID: String, route: String?,
                            response: GatewayResponse, error: String?, duration: Duration) {
        let headerValues: (HTTPField.Name) -> [String] = { name in
            serverRequest.headers.filter { $0.name.equalsIgnoringASCIICase(name.rawName) }.map(\.value)
        }
        write(LineRequest(method: serverRequest.method, target: serverRequest.target, client: serverRequest.clientAddress,
                          bytesIn: serverRequest.body.count, headerValues: headerValues),
              requestID: requestID, route: route ?? "", upstream: nil, stats: nil, status: response.status.code,
              bytesOut: serverRequest.method == "HEAD" ? 0 : response.body.count ?? 0, error: error,
              timing: Timing(ttfb: duration, duration: duration, ended: .complete))
    }

    /// What a line says about the request itself.
    private struct LineRequest {
        var method: String
        var target: String
        var client: String
        var bytesIn: Int
        var headerValues: (HTTPField.Name) -> [String]
    }

    private func write(_ request: LineRequest, requestID: String, route: String?, upstream: String?,
                       stats: RequestStats.Values?, status: Int, bytesOut: Int, error: String?, timing: Timing) {
        var metadata: Logger.Metadata = [
            "request_id": .string(requestID),
            "client": .string(request.client),
            "method": .string(request.method),
            "path": .string(redactedTarget(request.target)),
            "status": .stringConvertible(status),
            "bytes_in": .stringConvertible(request.bytesIn),
            "bytes_out": .stringConvertible(bytesOut),
            "duration_ms": .string(Self.milliseconds(timing.duration)),
            "ended": .string(timing.session?.rawValue ?? timing.ended.rawValue),
        ]
        if let ttfb = timing.ttfb { metadata["ttfb_ms"] = .string(Self.milliseconds(ttfb)) }
        if let route { metadata["route"] = .string(route) }
        if let upstream { metadata["upstream"] = .string(upstream) }
        if let stats {
            if stats.attempts > 0 {
                metadata["upstream_ms"] = .string(Self.milliseconds(stats.upstreamDuration))
                metadata["attempts"] = .stringConvertible(stats.attempts)
                // Hedges are attempts too, but not retries (they have their own `hedges`).
                let hedges = stats[RetryMiddleware.Tally.self]?.sent ?? 0
                metadata["retries"] = .stringConvertible(max(0, stats.attempts - 1 - hedges))
            }
            if let cache = stats.cacheStatus { metadata["cache"] = .string(cache) }
            if let credential = stats.credential { metadata["credential"] = .string(credential) }
            for (key, value) in stats.extra { metadata[key] = .string(value) }
        }
        if let error { metadata["error"] = .string(error) }
        for name in settings.includeHeaders {
            guard let fieldName = HTTPField.Name(name) else { continue }
            let values = request.headerValues(fieldName)
            guard !values.isEmpty else { continue }
            let key = "header_" + name.lowercased().replacingOccurrences(of: "-", with: "_")
            metadata[key] = .string(redactHeaders.contains(name.lowercased()) ? "[REDACTED]" : values.joined(separator: ", "))
        }
        logger.info("request", metadata: metadata)
    }

    /// The target with configured query parameters' values replaced.
    func redactedTarget(_ target: String) -> String {
        guard !redactQuery.isEmpty, let mark = target.utf8.firstIndex(of: UInt8(ascii: "?")) else { return target }
        let query = target[target.utf8.index(after: mark)...]
        let parts = query.split(separator: "&", omittingEmptySubsequences: false).map { pair -> Substring in
            let name = pair.split(separator: "=", maxSplits: 1).first ?? pair
            return redactQuery.contains(String(name)) ? name + "=[REDACTED]" : pair
        }
        return String(target[..<mark]) + "?" + parts.joined(separator: "&")
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
