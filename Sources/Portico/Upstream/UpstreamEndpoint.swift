/// The endpoint of a proxied route: forwards to an upstream and records the time spent and
/// the attempt for the access log and metrics (also when the attempt fails).
public struct UpstreamEndpoint: Responder {
    public let client: any UpstreamClient

    public init(client: any UpstreamClient) {
        self.client = client
    }

    public func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        let start = context.clock.now
        defer {
            let elapsed = start.duration(to: context.clock.now)
            context.stats.update { stats in
                stats.upstreamDuration += elapsed
                stats.attempts += 1
            }
        }
        return try await client.send(request, context: context)
    }
}
