/// One chain step as `GET /routes` and `portico explain` show it. Each middleware type writes
/// its own, next to its code (`CacheMiddleware+Describe.swift` in `Cache/`).
public struct StepDescription: Sendable, Equatable, Encodable {
    /// Its settings in a few words: `key client_ip, 100/s, burst 200`.
    public var settings: String
    /// What it may answer by itself without going further in (`fresh hit`, `429 when the
    /// bucket is empty`); `nil` when it always calls the next step.
    public var answersAtOnce: String?
    /// What it would do for the request asked about; `nil` without one.
    public var action: String?

    public init(settings: String, answersAtOnce: String? = nil, action: String? = nil) {
        self.settings = settings
        self.answersAtOnce = answersAtOnce
        self.action = action
    }

    enum CodingKeys: String, CodingKey {
        case settings, action
        case answersAtOnce = "answers_at_once"
    }
}

/// A request `portico explain` asks about, as the chain would see it: routed, with its context.
public struct ExplainedRequest: Sendable {
    public var request: GatewayRequest
    public var context: RequestContext
}

extension Middleware {
    /// A type that does not describe itself: named, and whether it can answer at once.
    public func describe(for request: ExplainedRequest?) -> StepDescription {
        StepDescription(settings: String(describing: Self.self),
                        answersAtOnce: self is any ImmediateMiddleware ? "may answer without going further in" : nil,
                        action: request == nil ? nil : "runs (this type does not describe what it does)")
    }
}
