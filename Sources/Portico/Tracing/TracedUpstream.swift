import HTTPTypes
import OTelSemanticConventions
import Tracing

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
