import Foundation
import HTTPTypes

/// `type: basic`: `Authorization: Basic base64(user:pass)` (RFC 7617), computed once.
public struct BasicAuthProvider: CredentialProvider {
    public let name: String
    public var headerName: HTTPField.Name { .authorization }
    private let value: String

    public init(name: String, username: String, password: String) {
        self.name = name
        value = "Basic " + Data("\(username):\(password)".utf8).base64EncodedString()
    }

    public func header(context: RequestContext) async throws -> CredentialHeader {
        CredentialHeader(name: .authorization, value: value)
    }

    /// The same value would be sent again: a replay cannot help.
    public func invalidate(_ header: CredentialHeader) async -> Bool { false }

    public func shutdown() async {}
}

extension BasicAuthProvider: CustomStringConvertible, CustomDebugStringConvertible {
    /// The value stays out of logs and dumps.
    public var description: String { "BasicAuthProvider(\(name), \(headerName): <redacted>)" }
    public var debugDescription: String { description }
}
