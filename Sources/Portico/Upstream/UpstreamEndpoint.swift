import Metrics
import Synchronization

/// The endpoint of a proxied route: forwards to an upstream and records the time spent and
/// the attempt for the access log and metrics (also when the attempt fails).
public struct UpstreamEndpoint: Responder {
    public let client: any UpstreamClient
    private let metrics: UpstreamMetrics

    public init(client: any UpstreamClient, metrics: UpstreamMetrics? = nil) {
        self.client = client
        self.metrics = metrics ?? UpstreamMetrics(upstream: client.config.name)
    }

    nonisolated(nonsending) public func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        let start = context.clock.now
        var failure: String?
        defer {
            let elapsed = start.duration(to: context.clock.now)
            context.stats.update { stats in
                stats.upstreamDuration += elapsed
                stats.attempts += 1
            }
            metrics.record(elapsed, failure: failure)
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
/// `portico_upstream_request_duration_seconds{upstream}` and
/// `portico_upstream_errors_total{upstream,kind}` (kind: the `GatewayError.Kind` name, a fixed small set).
public final class UpstreamMetrics: Sendable {
    private let duration: Metrics.Timer
    private let upstream: String
    private let errors: LabelledCounters

    public init(upstream: String, factory: any MetricsFactory = MetricsSystem.factory) {
        self.upstream = upstream
        errors = LabelledCounters("portico_upstream_errors_total", factory: factory)
        duration = Metrics.Timer(label: "portico_upstream_request_duration_seconds", dimensions: [("upstream", upstream)], factory: factory)
    }

    func record(_ elapsed: Duration, failure: String?) {
        duration.recordNanoseconds(GatewayMetrics.nanoseconds(elapsed))
        guard let failure else { return }
        errors.increment([("upstream", upstream), ("kind", failure)])
    }
}
