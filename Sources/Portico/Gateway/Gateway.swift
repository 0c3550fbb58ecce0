import HTTPTypes
import Logging
import MicroHTTPD
import Synchronization

/// Turns server requests into gateway requests, routes them through the current runtime's
/// chains and turns the answers back. The runtime is swapped atomically on reload; a request
/// keeps the runtime it started with.
public final class Gateway: Sendable {
    private let runtime: Mutex<GatewayRuntime>
    private let draining = Atomic<Bool>(false)
    /// `listen.max_in_flight`, over every route; the cap follows reloads, the count carries over.
    private let inFlight: InFlightLimit
    let logger: Logger
    let clock: any GatewayClock
    let metrics: GatewayMetrics
    /// `https` when the listener terminates TLS: the requests' scheme, sent as `X-Forwarded-Proto`.
    let scheme: String

    public init(runtime: GatewayRuntime, logger: Logger, clock: any GatewayClock = SystemClock(),
                metrics: GatewayMetrics = GatewayMetrics(), scheme: String = "http") {
        self.runtime = Mutex(runtime)
        self.scheme = scheme
        self.inFlight = InFlightLimit(limit: runtime.config.listen.maxInFlight)
        self.logger = logger
        self.clock = clock
        self.metrics = metrics
    }

    /// The runtime new requests use.
    public var current: GatewayRuntime { runtime.withLock { $0 } }

    /// Installs `new` for new requests; returns the previous one (in-flight requests finish on it).
    @discardableResult
    public func install(_ new: GatewayRuntime) -> GatewayRuntime {
        inFlight.limit = new.config.listen.maxInFlight
        return runtime.withLock { current in
            let old = current
            current = new
            return old
        }
    }

    /// Once set, responses ask clients to close their connections.
    public func beginDraining() { draining.store(true, ordering: .relaxed) }

    public func handle(_ serverRequest: ServerRequest) async -> ServerResponse {
        let start = ContinuousClock.now
        metrics.requestStarted()
        var route: String?
        let response = await respond(to: serverRequest, route: &route)
        metrics.requestFinished(route: route, method: serverRequest.method, code: response.status,
                                duration: start.duration(to: .now))
        return response
    }

    private func respond(to serverRequest: ServerRequest, route routeName: inout String?) async -> ServerResponse {
        let runtime = current
        let requestID = serverRequest.header("x-request-id").flatMap { RequestID.isWellFormed($0) ? $0 : nil }
            ?? RequestID.generate()
        var logger = self.logger
        logger[metadataKey: "request_id"] = .string(requestID)
        let isHead = serverRequest.method == "HEAD"

        let request: GatewayRequest
        do {
            request = try GatewayRequest(validating: serverRequest, scheme: scheme)
        } catch {
            logger.debug("rejected malformed request", metadata: ["reason": .string(error.message)])
            return finish(error.response(requestID: requestID), requestID: requestID, isHead: isHead, close: true)
        }

        guard inFlight.tryEnter() else {
            metrics.overloaded(route: nil)
            return finish(GatewayError.overloaded(route: nil).response(requestID: requestID), requestID: requestID, isHead: isHead)
        }
        defer { inFlight.leave() }

        let route: Route
        switch runtime.router.match(method: request.method, host: request.head.authority, path: request.path) {
        case .route(let matched):
            route = matched
        case .notFound:
            return finish(GatewayError.notFound(path: request.path).response(requestID: requestID),
                          requestID: requestID, isHead: isHead)
        case .methodNotAllowed(let allow):
            return finish(GatewayError.methodNotAllowed(request.method, allow: allow).response(requestID: requestID),
                          requestID: requestID, isHead: isHead)
        }

        if let limit = route.inFlight {
            guard limit.tryEnter() else {
                routeName = route.name
                metrics.overloaded(route: route.name)
                return finish(GatewayError.overloaded(route: route.name).response(requestID: requestID),
                              requestID: requestID, isHead: isHead)
            }
        }
        defer { route.inFlight?.leave() }

        var deadline = clock.now.advanced(by: serverRequest.deadline - .now)
        if let timeout = route.timeout { deadline = min(deadline, clock.now.advanced(by: timeout)) }
        routeName = route.name
        logger[metadataKey: "route"] = .string(route.name)
        let context = RequestContext(requestID: requestID, route: route.name, upstream: route.upstream,
                                     deadline: deadline, logger: logger, clock: clock)
        var forwarded = request
        forwarded.headerFields[.xRequestID] = requestID

        let response: GatewayResponse
        do {
            response = try await route.responder.respond(to: forwarded, context: context)
        } catch let error as GatewayError {
            response = error.response(requestID: requestID)
        } catch is CancellationError {
            response = GatewayError.requestTimeout().response(requestID: requestID)
        } catch {
            logger.error("unexpected error in the chain", metadata: ["error": .string(String(describing: error))])
            response = GatewayError.internalError().response(requestID: requestID)
        }
        return finish(response, requestID: requestID, isHead: isHead)
    }

    private func finish(_ response: GatewayResponse, requestID: String, isHead: Bool, close: Bool = false) -> ServerResponse {
        var response = response
        response.headerFields[.xRequestID] = requestID
        var serverResponse = ServerResponse(response, isHead: isHead)
        serverResponse.closeConnection = close || draining.load(ordering: .relaxed)
        return serverResponse
    }
}

extension HTTPField.Name {
    static let xRequestID = HTTPField.Name("X-Request-ID")!
}
