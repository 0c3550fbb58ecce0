import NIOCore
import HTTPTypes
import Logging
import MicroHTTPD
import Synchronization

/// Turns server requests into gateway requests, routes them through the current runtime's
/// chains and turns the answers back. The runtime is swapped atomically on reload; a request
/// keeps the runtime it started with.
public final class Gateway: Sendable {
    /// The current runtime, one copy per daemon thread (`ServerRequest.thread`): each request
    /// reads its own thread's copy, so no lock a request takes is taken by another thread; a
    /// reload writes every copy.
    private let runtimes: [RuntimeSlot]
    /// Held while a reload writes every slot: taken per reload, never per request.
    private let installing = Mutex(())
    /// `listen.max_in_flight`, over every route; the cap follows reloads, the count carries over.
    private let inFlight: InFlightLimit
    /// `listen.max_websockets`: upgraded sessions open at once (with their handshakes).
    private let websockets: InFlightLimit
    /// The cap when `max_websockets` is 0 (not set): sized to the descriptor limit; 0 for none.
    private let defaultWebsocketLimit: Int
    let logger: Logger
    let clock: any GatewayClock
    let metrics: GatewayMetrics
    /// `https` when the listener terminates TLS: the requests' scheme, sent as `X-Forwarded-Proto`.
    let scheme: String

    /// `threads`: the server's daemon threads (requests of thread `i` read slot `i`).
    public init(runtime: GatewayRuntime, logger: Logger, clock: any GatewayClock = SystemClock(),
                metrics: GatewayMetrics = GatewayMetrics(), scheme: String = "http", threads: Int = 1,
                defaultWebsocketLimit: Int = 0) {
        self.runtimes = (0..<max(1, threads)).map { _ in RuntimeSlot(runtime) }
        self.scheme = scheme
        self.defaultWebsocketLimit = defaultWebsocketLimit
        self.inFlight = InFlightLimit(limit: runtime.config.listen.maxInFlight, name: "listen.max_in_flight")
        self.websockets = InFlightLimit(limit: Self.websocketLimit(runtime.config.listen, default: defaultWebsocketLimit),
                                        name: "listen.max_websockets")
        self.logger = logger
        self.clock = clock
        self.metrics = metrics
    }

    /// `listen.max_websockets`, or `defaultLimit` where it is 0 (not set).
    private static func websocketLimit(_ listen: ListenConfig, default defaultLimit: Int) -> Int {
        listen.maxWebsockets == 0 ? defaultLimit : listen.maxWebsockets
    }

    /// The runtime new requests use.
    public var current: GatewayRuntime { runtimes[0].runtime.withLock { $0 } }

    /// The runtime for a request read by daemon thread `thread`.
    private func current(thread: Int) -> GatewayRuntime {
        runtimes[thread < runtimes.count ? thread : thread % runtimes.count].runtime.withLock { $0 }
    }

    /// Installs `new` for new requests; returns the previous one (in-flight requests finish on it).
    /// Installs are serialized (a SIGHUP and an admin reload may race); each thread's copy
    /// changes on its own, so a thread may serve from the old runtime for the instant between two
    /// copies.
    @discardableResult
    public func install(_ new: GatewayRuntime) -> GatewayRuntime {
        installing.withLock { _ in
            inFlight.limit = new.config.listen.maxInFlight
            websockets.limit = Self.websocketLimit(new.config.listen, default: defaultWebsocketLimit)
            let old = current
            for slot in runtimes { slot.runtime.withLock { $0 = new } }
            return old
        }
    }

    /// Answers `serverRequest` at once when that needs no waiting — a malformed request, no
    /// route, an overload refusal, a direct route, a cache hit — and otherwise returns the work
    /// that answers it, for a task. Called on the server's thread: it never blocks.
    public func answer(_ serverRequest: ServerRequest) -> HTTPServer.Answer {
        let start = ContinuousClock.now
        metrics.requestStarted()
        let exchange: RoutedRequest
        switch prepare(serverRequest) {
        case .answered(let refusal):
            return .now(answered(serverRequest, refusal, since: start))
        case .routed(let routed):
            exchange = routed
        }
        let immediate: GatewayResponse?
        do {
            immediate = try exchange.route.responder.respondImmediately(to: exchange.request, context: exchange.context)
        } catch {
            immediate = response(for: error, context: exchange.context)
        }
        if let immediate {
            exchange.leave()
            return .now(finished(finish(immediate, requestID: exchange.context.requestID, isHead: exchange.isHead),
                                 route: exchange.route.name, method: serverRequest.method, since: start))
        }
        // The work holds what it needs of the server's request (its method), not the whole of it.
        let method = serverRequest.method
        let work: HTTPServer.Work = { [self] in
            var answer: GatewayResponse
            do {
                answer = try await exchange.route.responder.respond(to: exchange.request, context: exchange.context)
            } catch {
                answer = response(for: error, context: exchange.context)
            }
            let code = answer.status.code
            if answer.tunnel != nil || code == 101 {
                return switched(answer, exchange: exchange, method: method, since: start)
            }
            // A handshake answered without switching (401, 403, 426…): no session; the answer
            // goes back as any other.
            if exchange.request.upgrade != nil { websockets.leave() }
            if answer.body.isStreamed {
                guard HTTPSyntax.responseHasBody(status: code, toHead: exchange.isHead) else {
                    // Never read: its upstream is released now.
                    answer.discardBody()
                    defer { exchange.leave() }
                    return finished(finish(answer, requestID: exchange.context.requestID, isHead: exchange.isHead),
                                    route: exchange.route.name, method: method, since: start)
                }
                // In flight, and counted (time to first byte, duration), until the body ends, however it ends.
                answer.body.append(metrics.streamObserver(route: exchange.route.name, method: method,
                                                          code: code, start: start, then: { exchange.leave() }),
                                   keepsLength: true)
                return finish(answer, requestID: exchange.context.requestID, isHead: exchange.isHead)
            }
            defer { exchange.leave() }
            return finished(finish(answer, requestID: exchange.context.requestID, isHead: exchange.isHead),
                            route: exchange.route.name, method: method, since: start)
        }
        // A step let the request go only later (a rate limiter's token): its task waits first, on
        // its loop's timer, and the chain's frames exist only once it goes.
        if exchange.route.responder.defersStart, let deferred = exchange.context.stats.update({ $0[DeferredStart.self] }) {
            let clock = exchange.context.clock
            return .later({
                await Self.wait(for: deferred, clock: clock)
                return await work()
            }, requestID: exchange.context.requestID, upload: exchange.upload)
        }
        return .later(work, requestID: exchange.context.requestID, upload: exchange.upload)
    }

    /// The wait a `DeferredStart` asked for; cut short when the task is cancelled (the client
    /// left, the deadline passed, the server stopped), which `began` is told.
    private static func wait(for deferred: DeferredStart.Value, clock: any GatewayClock) async {
        var cancelled = false
        do {
            try await LoopTimer.sleep(until: deferred.at, clock: clock)
        } catch {
            cancelled = true
        }
        deferred.began(cancelled)
    }

    /// A 101, or an answer with a tunnel: a 101 with its tunnel to an upgrade request becomes the
    /// session (`UpgradeSession`), handed the client's connection once the head is sent; a 101
    /// without one (an upstream switching protocols unasked) is a 502. The request leaves its
    /// in-flight places at its answer; the session holds its `max_websockets` place until it ends.
    private func switched(_ answer: GatewayResponse, exchange: RoutedRequest, method: String,
                          since start: ContinuousClock.Instant) -> ServerResponse {
        defer { exchange.leave() }
        let route = exchange.route
        let requestID = exchange.context.requestID
        guard answer.status.code == 101, let tunnel = answer.tunnel, exchange.request.upgrade != nil else {
            answer.tunnel?.abandon()
            answer.discardBody()
            if exchange.request.upgrade != nil { websockets.leave() }
            exchange.context.logger.warning("the upstream switched protocols for a request that did not ask to upgrade")
            let refusal = GatewayError(.upstreamProtocolError, message: "the upstream switched protocols unasked")
                .response(requestID: requestID)
            return finished(finish(refusal, requestID: requestID, isHead: exchange.isHead),
                            route: route.name, method: method, since: start)
        }
        let metrics = self.metrics
        let websockets = self.websockets
        metrics.upgrades.opened(route: route.name)
        let session = UpgradeSession(tunnel: tunnel, idleTimeout: route.websocketIdleTimeout, clock: clock) { summary in
            metrics.upgrades.closed(route: route.name, summary)
            websockets.leave()
        }
        var response = finish(answer, requestID: requestID, isHead: false)
        response.payload = .upgrade(session)
        return finished(response, route: route.name, method: method, since: start)
    }

    /// Answers a request the server refused once its head was read (a head over
    /// `max_header_bytes`, a declared body over `max_body_bytes`, ambiguous framing): the JSON
    /// error with its request id, counted and logged like any request answered before a chain.
    /// The connection is closed.
    public func refused(_ serverRequest: ServerRequest, _ refusal: ServerRefusal) -> ServerResponse {
        let start = ContinuousClock.now
        metrics.requestStarted()
        let requestID = RequestID.accepted(from: serverRequest)
        let error = GatewayError(refusal)
        return answered(serverRequest, Refusal(error: error, requestID: requestID, isHead: false, close: true), since: start)
    }

    /// The answer to `serverRequest`, at once or after its work has run.
    public func handle(_ serverRequest: ServerRequest) async -> ServerResponse {
        switch answer(serverRequest) {
        case .now(let response): response
        case .later(let work, _, _): await work()
        }
    }

    /// A routed request on its way through its route's chain; it holds its in-flight places
    /// until `leave`.
    private struct RoutedRequest: Sendable {
        var route: Route
        var request: GatewayRequest
        var context: RequestContext
        var isHead: Bool
        let inFlight: InFlightLimit
        /// Where the server puts a streamed request body, feeding `request.body`.
        var upload: StreamedUploadSink?

        func leave() {
            route.inFlight?.leave()
            inFlight.leave()
        }
    }

    private enum Prepared {
        case answered(Refusal)
        case routed(RoutedRequest)
    }

    /// A request answered before any route's chain runs.
    private struct Refusal {
        var error: GatewayError
        var requestID: String
        var isHead: Bool
        /// The matched route, when there was one (its own in-flight cap refused the request).
        var route: Route?
        var close = false
    }

    /// Validates and routes the request and takes its in-flight places: what every request
    /// does before its route's chain.
    private func prepare(_ serverRequest: ServerRequest) -> Prepared {
        let runtime = current(thread: serverRequest.thread)
        let requestID = RequestID.accepted(from: serverRequest)
        let isHead = serverRequest.method == "HEAD"

        var request: GatewayRequest
        var upload: StreamedUploadSink?
        var streamedBody: Body?
        if let streamed = serverRequest.streamedBody {
            let (stream, writer) = BodyStream.makeStream(length: streamed.length)
            streamedBody = Body(stream: stream)
            upload = StreamedUploadSink(writer)
        }
        do {
            request = try GatewayRequest(validating: serverRequest, scheme: scheme, requestID: requestID, body: streamedBody)
        } catch {
            logger.debug("rejected malformed request", metadata: ["request_id": .string(requestID),
                                                                  "reason": .string(error.message)])
            return .answered(Refusal(error: error, requestID: requestID, isHead: isHead, close: true))
        }

        guard inFlight.tryEnter() else {
            metrics.overloaded(route: nil)
            return .answered(Refusal(error: .overloaded(route: nil), requestID: requestID, isHead: isHead))
        }

        let route: Route
        switch runtime.router.match(method: request.method, host: request.head.authority, path: request.path) {
        case .route(let matched):
            route = matched
        case .notFound:
            inFlight.leave()
            return .answered(Refusal(error: .notFound(path: request.path), requestID: requestID, isHead: isHead))
        case .methodNotAllowed(let allow):
            inFlight.leave()
            return .answered(Refusal(error: .methodNotAllowed(request.method, allow: allow), requestID: requestID,
                                     isHead: isHead))
        }

        // A declared body its endpoint cannot take is refused before a byte of it is read (the
        // connection is closed: the client may still be sending it).
        if let cap = route.maxRequestBodyBytes, let declared = serverRequest.streamedBody?.length, declared > cap {
            inFlight.leave()
            return .answered(Refusal(error: URLSessionUpstream.uploadTooLarge(limit: cap, declared: declared),
                                     requestID: requestID, isHead: isHead, route: route, close: true))
        }

        if let limit = route.inFlight, !limit.tryEnter() {
            inFlight.leave()
            metrics.overloaded(route: route.name)
            return .answered(Refusal(error: .overloaded(route: route.name), requestID: requestID, isHead: isHead,
                                     route: route))
        }

        if !route.upgrade.isEmpty, let asked = UpgradeRequest.protocolAsked(request), route.upgrade.contains(asked) {
            guard websockets.tryEnter() else {
                route.inFlight?.leave()
                inFlight.leave()
                metrics.overloaded(route: route.name)
                return .answered(Refusal(error: .overloaded(route: route.name), requestID: requestID, isHead: isHead,
                                         route: route))
            }
            request.upgrade = asked
        }
        var deadline = clock.now.advanced(by: serverRequest.deadline - .now)
        if let timeout = route.timeout { deadline = min(deadline, clock.now.advanced(by: timeout)) }
        var context = RequestContext(requestID: requestID, route: route.name, upstream: route.upstream,
                                     deadline: deadline, logger: logger, clock: clock)
        context.streamIdleTimeout = route.streamIdleTimeout
        context.maxStreamDuration = route.maxStreamDuration
        return .routed(RoutedRequest(route: route, request: request, context: context, isHead: isHead, inFlight: inFlight,
                                upload: upload))
    }

    /// The error response for what a chain threw.
    private func response(for error: any Error, context: RequestContext) -> GatewayResponse {
        if !(error is GatewayError || error is CancellationError) {
            context.logger.error("unexpected error in the chain", metadata: ["error": .string(String(describing: error))])
        }
        return GatewayError.answering(error).response(requestID: context.requestID)
    }

    /// Answers a request refused before any chain, with its access-log line: written by the
    /// route's own `access_log` when a route matched, otherwise by the one in
    /// `defaults.middleware` (`route` empty), if any.
    private func answered(_ serverRequest: ServerRequest, _ refusal: Refusal,
                          since start: ContinuousClock.Instant) -> ServerResponse {
        let response = refusal.error.response(requestID: refusal.requestID)
        let accessLog = if let route = refusal.route { route.accessLog } else {
            current(thread: serverRequest.thread).unroutedAccessLog
        }
        accessLog?.logAnswered(serverRequest, requestID: refusal.requestID, route: refusal.route?.name,
                               response: response, error: refusal.error.kind.name, duration: start.duration(to: .now))
        return finished(finish(response, requestID: refusal.requestID, isHead: refusal.isHead, close: refusal.close),
                        route: refusal.route?.name, method: serverRequest.method, since: start)
    }

    private func finished(_ response: ServerResponse, route: String?, method: String,
                          since start: ContinuousClock.Instant) -> ServerResponse {
        let duration = start.duration(to: .now)
        metrics.requestFinished(route: route, method: method, code: response.status, duration: duration)
        // A buffered answer leaves whole: its first byte is its last.
        metrics.firstByte(route: route, after: duration)
        return response
    }

    private func finish(_ response: GatewayResponse, requestID: String, isHead: Bool, close: Bool = false) -> ServerResponse {
        var serverResponse = ServerResponse(response, isHead: isHead, requestID: requestID)
        // While the server drains, it asks every client to close (`ServerLifecycle.draining`).
        serverResponse.closeConnection = close
        return serverResponse
    }
}

extension HTTPField.Name {
    static let xRequestID = HTTPField.Name("X-Request-ID")!
}

/// One daemon thread's copy of the current runtime, alone on its cache lines (the padding): the
/// lock word of one thread's slot must not share a line with another's.
private final class RuntimeSlot: Sendable {
    let runtime: Mutex<GatewayRuntime>
    private let padding: (Int, Int, Int, Int, Int, Int, Int, Int) = (0, 0, 0, 0, 0, 0, 0, 0)

    init(_ runtime: GatewayRuntime) {
        self.runtime = Mutex(runtime)
    }
}
