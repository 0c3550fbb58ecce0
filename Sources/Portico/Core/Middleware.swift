/// The next step in the chain: the middleware further in, or the route's endpoint.
public typealias NextHandler = nonisolated(nonsending) @Sendable (GatewayRequest, RequestContext) async throws -> GatewayResponse

/// One step of a route's chain. Transform the request, call `next`, transform the response —
/// or answer early without calling `next`.
///
/// ```swift
/// struct AddHeader: Middleware {
///     func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
///         var response = try await next(request, context)
///         response.headerFields[.server] = "portico"
///         return response
///     }
/// }
///
/// struct Deny: Middleware {
///     func handle(_ request: GatewayRequest, context: RequestContext, next: NextHandler) async throws -> GatewayResponse {
///         throw GatewayError.notFound(path: request.path)
///     }
/// }
/// ```
///
/// `next` is escaping so a middleware may keep calling it after answering (the cache's
/// background refresh); implementations that only call it inline can declare it non-escaping.
public protocol Middleware: Sendable {
    nonisolated(nonsending)
    func handle(_ request: GatewayRequest, context: RequestContext, next: @escaping NextHandler) async throws -> GatewayResponse

    /// What this step is and, given a request, what it would do with it (`GET /routes`,
    /// `portico explain`). The default (`StepDescription.swift`) names the type only.
    func describe(for request: ExplainedRequest?) -> StepDescription
}

/// The next step of a chain asked to answer at once: a response, or `nil` when it cannot
/// answer without waiting.
public typealias ImmediateNextHandler = @Sendable (GatewayRequest, RequestContext) throws -> GatewayResponse?

/// A middleware that can take part in answering a request at once, on the server's own thread,
/// before any task is started: a cache hit, a rate-limit refusal, the access log line around them.
///
/// `handleImmediately` returns `nil` when the request needs waiting (I/O, a lock held for long,
/// CPU work worth yielding over); the request then goes through `handle` in a task as usual.
/// A `nil` answer must leave no trace the later `handle` would repeat — no metric counted, no
/// token taken twice (see `RequestContext.stats` for carrying a decision over) — and it must
/// never block.
public protocol ImmediateMiddleware: Middleware {
    func handleImmediately(_ request: GatewayRequest, context: RequestContext,
                           next: ImmediateNextHandler) throws -> GatewayResponse?
    /// Whether `handleImmediately` may set a `DeferredStart`: only then does the gateway look
    /// for one (reading the request's facts on the server's thread, which a request's task
    /// otherwise has to itself).
    var defersStart: Bool { get }
}

extension ImmediateMiddleware {
    public var defersStart: Bool { false }
}

/// Set by an `ImmediateMiddleware` that lets its request go only later (a rate limiter whose
/// token is due in a while, `on_limit: wait`): the gateway then starts the request's task at
/// `at`, on a timer of the request's event loop, so a waiting request holds no frames of its
/// chain, only its connection and this. `began` runs once, first thing in the task: `cancelled`
/// when the wait ended early (the client left, the deadline passed, the server stopped). The
/// chain then runs from the start as for any request; the middleware that set this must refuse
/// in `handle` when the task is cancelled, having given back what it held in `began`.
public enum DeferredStart: RequestStatsKey {
    public struct Value: Sendable {
        public let at: ContinuousClock.Instant
        public let began: @Sendable (_ cancelled: Bool) -> Void

        public init(at: ContinuousClock.Instant, began: @escaping @Sendable (_ cancelled: Bool) -> Void) {
            self.at = at
            self.began = began
        }
    }
}

/// The endpoint a chain ends in: an upstream, or a direct response.
public protocol Responder: Sendable {
    nonisolated(nonsending) func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse
    /// The answer when it needs no waiting, under the rules of `ImmediateMiddleware`; `nil`
    /// (the default) sends the request through `respond`.
    func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse?
    /// Whether `respondImmediately` can ever answer, so a chain need not ask when it cannot.
    var answersImmediately: Bool { get }
    /// Whether `respondImmediately` may leave a `DeferredStart` for the gateway.
    var defersStart: Bool { get }
}

extension Responder {
    public func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse? {
        nil
    }

    public var answersImmediately: Bool { false }
    public var defersStart: Bool { false }
}

/// A route's middleware wrapped around its endpoint, assembled once when configuration loads.
public struct MiddlewareChain: Responder {
    private let entry: NextHandler
    /// Walks in through `ImmediateMiddleware` steps; `nil` when the outermost step is not one,
    /// or when nothing in the chain could ever answer at once.
    private let immediateEntry: ImmediateNextHandler?
    public let middleware: [any Middleware]
    /// A step reached on the way in at once may let its request go only later.
    public let defersStart: Bool

    /// `middleware` is ordered outermost first.
    public init(_ middleware: [any Middleware], endpoint: any Responder) {
        self.middleware = middleware
        var next: NextHandler = { request, context in
            try await endpoint.respond(to: request, context: context)
        }
        var immediate: ImmediateNextHandler?
        var defers = false
        if endpoint.answersImmediately {
            immediate = { request, context in try endpoint.respondImmediately(to: request, context: context) }
        }
        for step in middleware.reversed() {
            let inner = next
            next = { request, context in
                try await step.handle(request, context: context, next: inner)
            }
            if let step = step as? any ImmediateMiddleware {
                // A step further in that cannot answer at once still lets this one try (a cache
                // before `auth` answers hits; its misses need `auth`, and so the task).
                let innerImmediate = immediate ?? { _, _ in nil }
                immediate = { request, context in
                    try step.handleImmediately(request, context: context, next: innerImmediate)
                }
                defers = defers || step.defersStart
            } else {
                immediate = nil
                defers = false
            }
        }
        entry = next
        immediateEntry = immediate
        defersStart = defers
    }

    nonisolated(nonsending)
    public func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        try await entry(request, context)
    }

    public func respondImmediately(to request: GatewayRequest, context: RequestContext) throws -> GatewayResponse? {
        try immediateEntry?(request, context)
    }

    public var answersImmediately: Bool { immediateEntry != nil }
}
