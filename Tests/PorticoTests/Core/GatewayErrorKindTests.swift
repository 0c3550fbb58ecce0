import Foundation
import HTTPTypes
import MicroHTTPD
import Portico
import PorticoTesting
import Testing

/// Failures are typed end to end: the kind decides status, code, retry, the metric label and
/// the access log; the message is only for people.
@Suite("Gateway error kinds")
struct GatewayErrorKindTests {
    /// Messages a rewording could produce, including ones that look like another kind's.
    static let messages = ["", "upstream orders: connect failed: refused", "upstream orders: connection closed: reset",
                           "anything at all", "upstream orders did not answer within the deadline"]

    @Test("retry classification follows the kind whatever the message says")
    func retryIgnoresWording() {
        let expected: [(GatewayError.Kind, RetryConfig.Condition?)] = [
            (.upstreamConnectFailed, .connectError), (.upstreamConnectionClosed, .reset),
            (.upstreamConnectTimeout, .timeout), (.upstreamTimeout, .timeout),
            (.upstreamTLSError, nil), (.upstreamProtocolError, nil), (.upstreamResponseTooLarge, nil),
            (.badRequest, nil), (.requestTimeout, nil), (.credentialsUnavailable, nil), (.internalError, nil),
        ]
        for (kind, condition) in expected {
            for message in Self.messages {
                #expect(RetryMiddleware.classify(GatewayError(kind, message: message)) == condition, "\(kind): \(message)")
            }
        }
    }

    @Test("status and JSON code derive from the kind; kinds a client need not tell apart share a code")
    func statusAndCode() throws {
        #expect(GatewayError(.upstreamConnectFailed, message: "x").status == .badGateway)
        #expect(GatewayError(.upstreamConnectFailed, message: "x").code == "upstream_unavailable")
        #expect(GatewayError(.upstreamConnectionClosed, message: "x").code == "upstream_unavailable")
        #expect(GatewayError(.upstreamConnectTimeout, message: "x").code == "upstream_timeout")
        #expect(GatewayError(.upstreamConnectTimeout, message: "x").status == .gatewayTimeout)
        #expect(GatewayError.Kind.upstreamConnectFailed != .upstreamConnectionClosed)
        #expect(GatewayError.Kind.upstreamConnectFailed.name == "upstream_connect_failed")

        let error = UpstreamError.connectFailed("connection refused (127.0.0.1:1)").gatewayError(upstream: "files")
        #expect(error.kind == .upstreamConnectFailed)
        #expect(error.message == "upstream files: connection refused (127.0.0.1:1)")
        #expect(error.cause as? UpstreamError == .connectFailed("connection refused (127.0.0.1:1)"))

        let response = error.response(requestID: "abc")
        let body = try #require(response.body.buffer.map { String(buffer: $0) })
        #expect(body == #"{"error":"upstream_unavailable","message":"upstream files: connection refused (127.0.0.1:1)","request_id":"abc"}"# + "\n")
    }

    @Test("the server's own refusals map to kinds with the status the server chose")
    func refusals() {
        let refusals: [(ServerRefusal, GatewayError.Kind)] = [
            (.badFraming("both Content-Length and Transfer-Encoding"), .badRequest),
            (.unsupportedTransferCoding, .notImplemented), (.headTooLarge(limit: 10), .headersTooLarge),
            (.bodyTooLarge(limit: 10), .payloadTooLarge), (.shuttingDown, .shuttingDown),
            (.deadlineExceeded, .requestTimeout), (.responseHeadTooLarge, .responseHeadTooLarge),
        ]
        for (refusal, kind) in refusals {
            let error = GatewayError(refusal)
            #expect(error.kind == kind)
            #expect(error.status.code == refusal.status, "\(refusal)")
            #expect(error.message == refusal.message)
        }
    }

    @Test("the upstream error metric is labelled with the kind")
    func metricLabel() async throws {
        let metrics = RecordingMetrics()
        let endpoint = UpstreamEndpoint(client: FailingUpstream(failure: .connectionClosed("reset")),
                                        metrics: UpstreamMetrics(upstream: "orders", factory: metrics))
        await #expect(throws: GatewayError.self) {
            try await endpoint.respond(to: RetryFixture.request(), context: RetryFixture.context(clock: ManualClock()))
        }
        let series = [("upstream", "orders"), ("protocol", "http1"), ("kind", "upstream_connection_closed")]
        #expect(metrics.value("portico_upstream_errors_total", series) == 1)
    }

    @Test("the upstream metrics' protocol label is http2 for an attempt that went out on HTTP/2, http1 otherwise")
    func protocolLabel() async throws {
        let metrics = RecordingMetrics()
        let h2 = UpstreamEndpoint(client: FailingUpstream(failure: .protocolError("HTTP/2: a flood"), spoken: "h2"),
                                  metrics: UpstreamMetrics(upstream: "orders", mayUseHTTP2: true, factory: metrics))
        let h1 = UpstreamEndpoint(client: FailingUpstream(failure: .protocolError("bad head"), spoken: "http/1.1"),
                                  metrics: UpstreamMetrics(upstream: "orders", mayUseHTTP2: true, factory: metrics))
        for endpoint in [h2, h2, h1] {
            await #expect(throws: GatewayError.self) {
                try await endpoint.respond(to: RetryFixture.request(), context: RetryFixture.context(clock: ManualClock()))
            }
        }
        #expect(metrics.value("portico_upstream_errors_total", [("upstream", "orders"), ("protocol", "http2"), ("kind", "upstream_protocol_error")]) == 2)
        #expect(metrics.value("portico_upstream_errors_total", [("upstream", "orders"), ("protocol", "http1"), ("kind", "upstream_protocol_error")]) == 1)
    }

    @Test("the access log's error field names the kind")
    func accessLog() async throws {
        let capture = LogCapture(message: "request")
        let clock = ManualClock()
        let log = AccessLogMiddleware(AccessLogConfig(), logger: capture.logger, clock: clock)
        await #expect(throws: GatewayError.self) {
            _ = try await log.handle(RetryFixture.request(), context: RetryFixture.context(clock: clock)) { _, _ in
                throw UpstreamError.connectFailed("connection refused").gatewayError(upstream: "orders")
            }
        }
        let line = try #require(capture.records.last)
        #expect(line["error"]?.description == "upstream_connect_failed")
        #expect(line["status"]?.description == "502")
    }
}

/// An upstream whose every exchange fails with `failure`.
private struct FailingUpstream: UpstreamClient {
    let failure: UpstreamError
    /// The access log's `upstream_protocol` and `AttemptSpokeHTTP2`, as `NIOUpstream` sets them (nil: not set, as on HTTP/1.1 upstreams).
    var spoken: String?
    var config: UpstreamConfig { UpstreamConfig(name: "orders", url: URL(string: "http://127.0.0.1:1")!) }
    func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        if let spoken {
            context.stats.update { stats in
                stats.extra.append(("upstream_protocol", spoken))
                stats[AttemptSpokeHTTP2.self] = spoken == "h2"
            }
        }
        throw failure.gatewayError(upstream: config.name)
    }
    func shutdown() async {}
    func retire() async {}
}
