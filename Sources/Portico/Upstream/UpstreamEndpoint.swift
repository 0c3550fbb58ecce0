import Metrics
import Synchronization

/// The endpoint of a proxied route: forwards to an upstream and records the time spent and
/// the attempt for the access log and metrics (also when the attempt fails).
public struct UpstreamEndpoint: Responder {
    public let client: any UpstreamClient
    private let metrics: UpstreamMetrics

    public init(client: any UpstreamClient, metrics: UpstreamMetrics? = nil) {
        self.client = client
        self.metrics = metrics ?? UpstreamMetrics(upstream: client.config.name, mayUseHTTP2: client.config.httpProtocol != .http1)
    }

    nonisolated(nonsending) public func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        let start = context.clock.now
        var failure: String?
        defer {
            let elapsed = start.duration(to: context.clock.now)
            // The protocol this attempt went out on: `NIOUpstream` records it for each attempt on
            // an upstream that may speak HTTP/2; everything else is HTTP/1.1.
            let http2 = context.stats.update { stats in
                stats.upstreamDuration += elapsed
                stats.attempts += 1
                return metrics.mayUseHTTP2 && stats[AttemptSpokeHTTP2.self] == true
            }
            metrics.record(elapsed, failure: failure, http2: http2)
        }
        do {
            return try await client.send(request, context: context)
        } catch let error as GatewayError {
            failure = error.kind.name
            throw error
        } catch is CancellationError {
            failure = "cancelled"
            throw CancellationError()
        } catch {
            failure = "other"
            throw error
        }
    }
}

/// Per-upstream metric handles, made once when the runtime is built:
/// `portico_upstream_request_duration_seconds{upstream,protocol}` and
/// `portico_upstream_errors_total{upstream,protocol,kind}` (kind: the `GatewayError.Kind` name,
/// a fixed small set; protocol: `http1` or `http2`, what the attempt went out on). The `http2`
/// histogram exists only for upstreams that may speak it (`protocol: http2 | auto`): an HTTP/1.1
/// upstream exports one series set, as before.
public final class UpstreamMetrics: Sendable {
    private let http1Duration: Metrics.Timer
    private let http2Duration: Metrics.Timer?
    private let upstream: String
    private let errors: LabelledCounters

    public init(upstream: String, mayUseHTTP2: Bool = false, factory: any MetricsFactory = MetricsSystem.factory) {
        self.upstream = upstream
        errors = LabelledCounters("portico_upstream_errors_total", factory: factory)
        http1Duration = Metrics.Timer(label: "portico_upstream_request_duration_seconds",
                                      dimensions: [("upstream", upstream), ("protocol", "http1")], factory: factory)
        http2Duration = mayUseHTTP2 ? Metrics.Timer(label: "portico_upstream_request_duration_seconds",
                                                    dimensions: [("upstream", upstream), ("protocol", "http2")], factory: factory) : nil
    }

    /// Whether the upstream may speak HTTP/2 (`protocol: http2 | auto`): its attempts say which they used.
    var mayUseHTTP2: Bool { http2Duration != nil }

    func record(_ elapsed: Duration, failure: String?, http2: Bool = false) {
        let http2 = http2 && http2Duration != nil
        ((http2 ? http2Duration : nil) ?? http1Duration).recordNanoseconds(GatewayMetrics.nanoseconds(elapsed))
        guard let failure else { return }
        errors.increment([("upstream", upstream), ("protocol", http2 ? "http2" : "http1"), ("kind", failure)])
    }
}

/// Whether an upstream attempt went out on HTTP/2: written by `NIOUpstream` for each attempt on an
/// upstream that may speak it (and by any client that does), read by `UpstreamEndpoint` for the
/// metrics' `protocol` label.
public enum AttemptSpokeHTTP2: RequestStatsKey {
    public typealias Value = Bool
}
