import Logging

/// A transport that forwards one request to one upstream and returns its answer.
///
/// The request arrives with the route's target already rewritten (`strip_prefix` applied,
/// raw path and query, never percent-decoded); the client joins it onto the upstream base
/// URL, applies header hygiene (`ForwardingHeaders`), and enforces the request's deadline.
/// Failures are thrown as `GatewayError` (mapped from `UpstreamError`) so the chain sees
/// one error type; task cancellation is rethrown as `CancellationError`.
public protocol UpstreamClient: Sendable {
    var config: UpstreamConfig { get }
    nonisolated(nonsending) func send(_ request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse
    /// Cancels in-flight exchanges and releases connections. Call once, after the last `send`.
    func shutdown() async
    /// A reload replaced this client and its requests have had their request timeout: later
    /// sends fail, idle connections close, and exchanges still in flight (response streams)
    /// finish on their own terms — their stream idle timeout and maximum duration — then close.
    func retire() async
}

/// Builds the configured transport for an upstream. `loops`: the event loops the gateway's
/// requests run on (`nio` keeps its connections per loop of these). Several endpoints, a
/// circuit breaker, an adaptive concurrency limit or health checks make a `BalancedUpstream` over one transport client per endpoint; `clock`
/// times its ejections.
/// `previous`: the client this one replaces at a reload; a `BalancedUpstream` hands over the
/// records and clients of its unchanged endpoints.
public func makeUpstreamClient(_ config: UpstreamConfig, logger: Logger, loops: EventLoops = .shared,
                               clock: any GatewayClock = SystemClock(), previous: (any UpstreamClient)? = nil) -> any UpstreamClient {
    if config.endpoints.count > 1 || config.circuitBreaker != nil || config.adaptiveConcurrency != nil || config.healthCheck != nil || config.dnsRefresh != nil {
        return BalancedUpstream(config: config, logger: logger, loops: loops, clock: clock,
                                previous: previous as? BalancedUpstream) { endpoint in
            makeTransportClient(endpoint, logger: logger, loops: loops)
        }
    }
    return makeTransportClient(config, logger: logger, loops: loops)
}

/// The transport client of one endpoint (`config.url`).
func makeTransportClient(_ config: UpstreamConfig, logger: Logger, loops: EventLoops) -> any UpstreamClient {
    switch config.transport {
    case .urlsession: URLSessionUpstream(config: config, logger: logger)
    case .nio: NIOUpstream(config: config, logger: logger, loops: loops)
    }
}
