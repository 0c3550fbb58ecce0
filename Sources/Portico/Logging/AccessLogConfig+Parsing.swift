extension AccessLogConfig {
    /// `type: access_log`. Listing `redact_headers` replaces the default list.
    static func parse(_ m: ConfigMapping) -> AccessLogConfig? {
        var c = AccessLogConfig()
        m.read("redact_headers", into: &c.redactHeaders) { $0.stringList { $0.headerName(lowercased: true) } }
        m.read("redact_query", into: &c.redactQuery) { $0.stringList { $0.nonEmptyString() } }
        m.read("include_headers", into: &c.includeHeaders) { $0.stringList { $0.headerName(lowercased: true) } }
        return c
    }
}
