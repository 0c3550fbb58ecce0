import Foundation

/// The last configuration reload (`SIGHUP` or `POST /-/reload`) and how it ended, for the dashboard.
public struct ReloadRecord: Sendable, Encodable, Equatable {
    /// Wall-clock time, RFC 3339.
    public var at: String
    public var ok: Bool
    /// Why it was refused (diagnostics with file, line and key path; never a value).
    public var errors: [String]

    public init(at date: Date = Date(), ok: Bool, errors: [String] = []) {
        at = date.formatted(.iso8601)
        self.ok = ok
        self.errors = errors
    }
}
