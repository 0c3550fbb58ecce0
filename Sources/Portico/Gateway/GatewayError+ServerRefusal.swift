import MicroHTTPD

extension GatewayError {
    /// What the HTTP server answered by itself, in the gateway's terms.
    public init(_ refusal: ServerRefusal) {
        let kind: Kind = switch refusal {
        case .badFraming, .malformedHead: .badRequest
        case .unsupportedTransferCoding: .notImplemented
        case .headTooLarge: .headersTooLarge
        case .bodyTooLarge: .payloadTooLarge
        case .shuttingDown: .shuttingDown
        case .deadlineExceeded: .requestTimeout
        case .responseHeadTooLarge: .responseHeadTooLarge
        case .upgradeFailed: .internalError
        }
        self.init(kind, message: refusal.message)
    }
}
