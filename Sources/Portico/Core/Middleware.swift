/// The next step in the chain: the middleware further in, or the route's endpoint.
public typealias NextHandler = @Sendable (GatewayRequest, RequestContext) async throws -> GatewayResponse

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
///         throw GatewayError(status: .forbidden, code: "forbidden", message: "not here")
///     }
/// }
/// ```
///
/// `next` is escaping so a middleware may keep calling it after answering (the cache's
/// background refresh); implementations that only call it inline can declare it non-escaping.
public protocol Middleware: Sendable {
    func handle(_ request: GatewayRequest, context: RequestContext, next: @escaping NextHandler) async throws -> GatewayResponse
}

/// The endpoint a chain ends in: an upstream, or a direct response.
public protocol Responder: Sendable {
    func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse
}

/// A route's middleware wrapped around its endpoint, assembled once when configuration loads.
public struct MiddlewareChain: Responder {
    private let entry: NextHandler
    public let middleware: [any Middleware]

    /// `middleware` is ordered outermost first.
    public init(_ middleware: [any Middleware], endpoint: any Responder) {
        self.middleware = middleware
        var next: NextHandler = { request, context in
            try await endpoint.respond(to: request, context: context)
        }
        for step in middleware.reversed() {
            let inner = next
            next = { request, context in
                try await step.handle(request, context: context, next: inner)
            }
        }
        entry = next
    }

    public func respond(to request: GatewayRequest, context: RequestContext) async throws -> GatewayResponse {
        try await entry(request, context)
    }
}
