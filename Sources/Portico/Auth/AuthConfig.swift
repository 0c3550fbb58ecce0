/// `type: auth`
public struct AuthConfig: Sendable, Equatable {
    public enum ClientHeaderPolicy: String, Sendable, Equatable, CaseIterable {
        /// Replace whatever the client sent.
        case override
        /// Keep the client's own header when present.
        case keepIfPresent = "keep_if_present"
    }
    public var credential: String
    public var clientHeader: ClientHeaderPolicy = .override

    public init(credential: String, clientHeader: ClientHeaderPolicy = .override) {
        self.credential = credential
        self.clientHeader = clientHeader
    }
}
