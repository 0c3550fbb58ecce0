/// `type: access_log`
public struct AccessLogConfig: Sendable, Equatable {
    /// Lower-cased header names whose values are replaced by `[REDACTED]`.
    public var redactHeaders: [String] = ["authorization", "proxy-authorization", "cookie", "set-cookie"]
    /// Query parameter names whose values are replaced.
    public var redactQuery: [String] = []
    /// Request headers to include in the line (lower-cased), beyond the standard fields.
    public var includeHeaders: [String] = []

    public init() {}
}
