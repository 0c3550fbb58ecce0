import OTel
import OTelSemanticConventions
import Tracing

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
    /// went wrong (`error.type`) from the result, `nil` for a success. `attributes` are only
    /// made for a span: a request that is not traced pays one task-local look-up.
    static func span<Result: Sendable>(_ operation: String, attributes: @autoclosure () -> SpanAttributes,
                                       failure: (Result) -> String? = { _ in nil },
                                       _ work: @Sendable () async throws -> Result) async rethrows -> Result {
        guard let parent = InstrumentationContext.current, let pipeline = parent[Key.self] else {
            return try await work()
        }
        let span = pipeline.tracer.startSpan(operation, context: parent, ofKind: .internal)
        span.attributes = attributes()
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
