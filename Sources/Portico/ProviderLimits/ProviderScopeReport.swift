import HTTPTypes

/// One learned scope as `GET /limits` shows it.
public struct ProviderScopeReport: Sendable, Equatable, Encodable {
    public var scope: String
    public var remaining: Int?
    public var limit: Int?
    public var resetSeconds: Double?
    public var holdSeconds: Double?
    public var inFlight: Int
    public var waiting: Int

    enum CodingKeys: String, CodingKey {
        case scope, remaining, limit, waiting
        case resetSeconds = "reset_seconds", holdSeconds = "hold_seconds", inFlight = "in_flight"
    }
}
