import HTTPTypes

/// `type: static`: a fixed header (its value typically from `${VAR}` or `${file:…}`).
public struct StaticHeaderProvider: CredentialProvider {
    public let name: String
    public let headerName: HTTPField.Name
    private let value: String

    /// `nil` when `header` is not a valid field name.
    public init?(name: String, header: String, value: String) {
        guard let fieldName = HTTPField.Name(header) else { return nil }
        self.name = name
        headerName = fieldName
        self.value = value
    }

    public func header(context: RequestContext) async throws -> CredentialHeader {
        CredentialHeader(name: headerName, value: value)
    }

    /// The same value would be sent again: a replay cannot help.
    public func invalidate(_ header: CredentialHeader) async -> Bool { false }

    public func shutdown() async {}
}

extension StaticHeaderProvider: CustomStringConvertible, CustomDebugStringConvertible {
    /// The value stays out of logs and dumps.
    public var description: String { "StaticHeaderProvider(\(name), \(headerName): <redacted>)" }
    public var debugDescription: String { description }
}
