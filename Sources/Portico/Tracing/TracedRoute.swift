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
    var defersStart: Bool { inner.defersStart }

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
        if let tunnel = answer.tunnel {
            // One span for an upgraded session: from the handshake to the session's end.
            tunnel.onEnd { summary in
                if span.isRecording {
                    span.updateAttributes { attributes in
                        attributes["portico.websocket.end"] = summary.reason.rawValue
                        attributes["portico.websocket.bytes_in"] = summary.bytesFromClient
                        attributes["portico.websocket.bytes_out"] = summary.bytesFromUpstream
                    }
                }
                end(span, status: status, failure: nil, context: context)
            }
            return answer
        }
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
                if let hedges = stats[RetryMiddleware.Tally.self] {
                    attributes["portico.hedge.sent"] = hedges.sent
                    attributes["portico.hedge.won"] = hedges.won
                    attributes["portico.hedge.cancelled"] = hedges.cancelled
                    attributes["portico.hedge.winner"] = hedges.winner
                }
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
