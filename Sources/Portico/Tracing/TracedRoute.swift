import HTTPTypes
import OTel
import OTelSemanticConventions
import Tracing

/// The server span of every request a route answers, around the route's whole chain.
///
/// The span continues the client's trace when its `traceparent` is well-formed, and starts a
/// new one otherwise. While the chain runs, the span's context is the task's
/// `InstrumentationContext.current` (carrying the pipeline): the upstream attempts, the retry
/// waits and a token fetch become its children. Its trace and span ids go to the access log
/// (`trace_id`, `span_id`, through `RequestStats.extra`).
///
/// Built only when `tracing:` is configured: without it, routes are not wrapped at all.
struct TracedRoute: Responder {
    let inner: any Responder
    let pipeline: TracingPipeline
    let route: String
    /// The route's path pattern (`http.route`): its exact path, or its prefix followed by `*`.
    let httpRoute: String?

    var answersImmediately: Bool { inner.answersImmediately }

    /// A span started for an immediate answer that needed a task after all: `respond` goes on with it.
    enum PendingSpan: RequestStatsKey {
        typealias Value = any Span
    }

    func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse? {
        guard inner.answersImmediately else { return nil }
        let span = start(request, context: context)
        let answer: GatewayResponse?
        do {
            answer = try InstrumentationContext.$current.withValue(span.context) {
                try inner.respondImmediately(to: request, context: context)
            }
        } catch {
            end(span, failure: error, context: context)
            throw error
        }
        guard let answer else {
            context.stats.update { $0[PendingSpan.self] = span }
            return nil
        }
        return ended(span, with: answer, request: request, context: context)
    }

    func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        let pending = context.stats.update { stats -> (any Span)? in
            defer { stats[PendingSpan.self] = nil }
            return stats[PendingSpan.self]
        }
        let span = pending ?? start(request, context: context)
        do {
            let answer = try await InstrumentationContext.$current.withValue(span.context) {
                try await inner.respond(to: request, context: context)
            }
            return ended(span, with: answer, request: request, context: context)
        } catch {
            end(span, failure: error, context: context)
            throw error
        }
    }

    private func start(_ request: GatewayRequest, context: RequestContext) -> any Span {
        var parent = InstrumentationContext.topLevel
        parent[TracingPipeline.Key.self] = pipeline
        pipeline.tracer.extract(TraceHeaders(validating: request.headerFields), into: &parent,
                                using: TraceHeadersExtractor())
        let method = request.method.rawValue
        let span = pipeline.tracer.startSpan(httpRoute.map { "\(method) \($0)" } ?? method, context: parent,
                                             ofKind: .server)
        if span.isRecording {
            span.updateAttributes { attributes in
                attributes[OTelAttribute.http.request.method] = method
                attributes[OTelAttribute.url.path] = String(request.path)
                attributes[OTelAttribute.url.scheme] = request.head.scheme ?? "http"
                if let authority = request.head.authority {
                    attributes[OTelAttribute.server.address] = authority
                }
                attributes[OTelAttribute.client.address] = request.clientAddress
                if let agent = request.headerFields[.userAgent] {
                    attributes[OTelAttribute.userAgent.original] = agent
                }
                attributes[OTelAttribute.network.protocol.version] = request.version.replacingOccurrences(of: "HTTP/", with: "")
                if let httpRoute { attributes[OTelAttribute.http.route] = httpRoute }
                attributes["portico.route"] = route
                attributes["portico.request_id"] = context.requestID
                if let upstream = context.upstream { attributes["portico.upstream"] = upstream }
            }
        }
        let ids = InstrumentationContext.$current.withValue(span.context) { TracingPipeline.logIDs.get() }
        if let traceID = ids["trace_id"], let spanID = ids["span_id"] {
            context.stats.update { stats in
                stats.extra.append(("trace_id", traceID.description))
                stats.extra.append(("span_id", spanID.description))
            }
        }
        return span
    }

    /// Ends the span when the answer has left: at once for a buffered one, when its body ends
    /// for a streamed one.
    private func ended(_ span: any Span, with answer: GatewayResponse, request: GatewayRequest,
                       context: RequestContext) -> GatewayResponse {
        let status = answer.status.code
        guard answer.body.isStreamed, request.method != .head else {
            end(span, status: status, failure: nil, context: context)
            return answer
        }
        var answer = answer
        answer.body.append(StreamObserver(clock: context.clock, onEnd: { seen in
            end(span, status: status, failure: seen.error?.kind.name, context: context)
        }), keepsLength: true)
        return answer
    }

    private func end(_ span: any Span, failure error: any Error, context: RequestContext) {
        let answer = GatewayError.answering(error)
        end(span, status: answer.status.code, failure: answer.kind.name, context: context)
    }

    private func end(_ span: any Span, status: Int, failure: String?, context: RequestContext) {
        if span.isRecording {
            let stats = context.stats.snapshot
            span.updateAttributes { attributes in
                attributes[OTelAttribute.http.response.statusCode] = status
                if let cache = stats.cacheStatus { attributes["portico.cache.status"] = cache }
                if let credential = stats.credential { attributes["portico.credential"] = credential }
                if stats.attempts > 0 { attributes["portico.upstream.attempts"] = stats.attempts }
                if let failure {
                    attributes[OTelAttribute.error.type] = failure
                } else if status >= 500 {
                    attributes[OTelAttribute.error.type] = String(status)
                }
            }
            // A server span is an error for 5xx only: a 4xx is the client's doing.
            if status >= 500 { span.setStatus(SpanStatus(code: .error)) }
        }
        span.end()
    }
}

/// The client span of one upstream attempt, around the route's endpoint (called once per
/// attempt, so a retried request shows each). The request goes upstream with this span's
/// `traceparent` (and the trace's `tracestate`), so the upstream's spans hang below it.
struct TracedUpstream: Responder {
    let endpoint: any Responder
    let pipeline: TracingPipeline
    let upstream: UpstreamConfig

    func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        var parent = InstrumentationContext.current ?? .topLevel
        if parent[TracingPipeline.Key.self] == nil { parent[TracingPipeline.Key.self] = pipeline }
        let method = request.method.rawValue
        let span = pipeline.tracer.startSpan(method, context: parent, ofKind: .client)
        if span.isRecording {
            let stats = context.stats.snapshot
            span.updateAttributes { attributes in
                attributes[OTelAttribute.http.request.method] = method
                if let host = upstream.url.host { attributes[OTelAttribute.server.address] = host }
                attributes[OTelAttribute.server.port] = upstream.url.port ?? (upstream.url.scheme == "https" ? 443 : 80)
                // Without the query: its values may be secrets.
                var base = upstream.url.absoluteString
                if base.hasSuffix("/") { base.removeLast() }
                attributes[OTelAttribute.url.full] = base + request.path
                if stats.attempts > 0 { attributes[OTelAttribute.http.request.resendCount] = stats.attempts }
                attributes["portico.upstream"] = upstream.name
                if let credential = stats.credential { attributes["portico.credential"] = credential }
            }
        }
        var request = request
        var headers = TraceHeaders()
        pipeline.tracer.inject(span.context, into: &headers, using: TraceHeadersInjector())
        headers.write(to: &request.headerFields)
        do {
            let answer = try await InstrumentationContext.$current.withValue(span.context) {
                try await endpoint.respond(to: request, context: context)
            }
            end(span, status: answer.status.code, failure: nil)
            return answer
        } catch {
            let answer = GatewayError.answering(error)
            end(span, status: nil, failure: answer.kind.name)
            throw error
        }
    }

    /// Ends at the response head: what the attempt is judged on (a retry decides on it).
    private func end(_ span: any Span, status: Int?, failure: String?) {
        if span.isRecording {
            span.updateAttributes { attributes in
                if let status { attributes[OTelAttribute.http.response.statusCode] = status }
                if let failure {
                    attributes[OTelAttribute.error.type] = failure
                } else if let status, status >= 400 {
                    attributes[OTelAttribute.error.type] = String(status)
                }
            }
            // A client span is an error for any 4xx or 5xx, and for no answer at all.
            if failure != nil || (status ?? 0) >= 400 { span.setStatus(SpanStatus(code: .error)) }
        }
        span.end()
    }
}

extension TracingPipeline {
    /// Marks a traced request's context with the pipeline its spans belong to, so code deep in
    /// the chain (a retry's wait, a token fetch) finds it without a global tracer.
    enum Key: InstrumentationContextKey {
        typealias Value = TracingPipeline
    }

    /// The `trace_id` and `span_id` of the span in force.
    static let logIDs = OTel.makeLoggingMetadataProvider()

    /// Runs `work` inside an internal span named `operation`, a child of the traced request in
    /// force; without one (tracing off, a background task), just runs it. `failure` names what
    /// went wrong (`error.type`) from the result, `nil` for a success.
    static func span<Result: Sendable>(_ operation: String, attributes: SpanAttributes,
                                       failure: (Result) -> String? = { _ in nil },
                                       _ work: @Sendable () async throws -> Result) async rethrows -> Result {
        guard let parent = InstrumentationContext.current, let pipeline = parent[Key.self] else {
            return try await work()
        }
        let span = pipeline.tracer.startSpan(operation, context: parent, ofKind: .internal)
        span.attributes = attributes
        do {
            let result = try await InstrumentationContext.$current.withValue(span.context) { try await work() }
            if let failure = failure(result) {
                span.attributes[OTelAttribute.error.type] = failure
                span.setStatus(SpanStatus(code: .error))
            }
            span.end()
            return result
        } catch {
            span.attributes[OTelAttribute.error.type] = GatewayError.answering(error).kind.name
            span.setStatus(SpanStatus(code: .error))
            span.end()
            throw error
        }
    }
}

extension TokenManager {
    /// One token call (`fetch`) in a `token fetch` span, when a traced request asked for it.
    static func traced(credential: String,
                       _ fetch: @Sendable () async -> Swift.Result<TokenResponse, TokenEndpointError>) async
        -> Swift.Result<TokenResponse, TokenEndpointError> {
        await TracingPipeline.span("token fetch", attributes: ["portico.credential": .string(credential)],
                                   failure: { result in
                                       guard case .failure(let error) = result else { return nil }
                                       return error.kindName
                                   }, fetch)
    }
}

extension RetryMiddleware {
    /// A retry's wait (`sleep`), in a `retry wait` span of the traced request in force.
    static func tracedWait(attempt: Int, reason: String, delay: Duration, _ sleep: @Sendable () async throws -> Void) async throws {
        try await TracingPipeline.span("retry wait", attributes: [
            "portico.retry.attempt": .int64(Int64(attempt)),
            "portico.retry.reason": .string(reason),
            "portico.retry.delay_ms": .int64(Int64(delay / .milliseconds(1))),
        ], sleep)
    }
}

extension TokenEndpointError {
    /// A short, fixed name for the failure (`error.type`): no detail text, no secret.
    var kindName: String {
        switch kind {
        case .http(let status, _): "http_\(status)"
        case .malformed: "malformed_response"
        case .transport: "transport"
        case .timeout: "timeout"
        case .noRefreshToken: "no_refresh_token"
        }
    }
}

extension Responder {
    /// This route responder inside a server span per request; itself when tracing is off.
    func traced(by pipeline: TracingPipeline?, route: RouteConfig) -> any Responder {
        guard let pipeline else { return self }
        let pattern = route.match.path ?? route.match.pathPrefix.map { $0 + "*" }
        return TracedRoute(inner: self, pipeline: pipeline, route: route.name, httpRoute: pattern)
    }

    /// This upstream endpoint inside a client span per attempt; itself when tracing is off.
    func traced(by pipeline: TracingPipeline?, upstream: UpstreamConfig) -> any Responder {
        guard let pipeline else { return self }
        return TracedUpstream(endpoint: self, pipeline: pipeline, upstream: upstream)
    }
}
