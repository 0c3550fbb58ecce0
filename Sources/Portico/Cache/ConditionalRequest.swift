import Foundation
import HTTPTypes

/// A client's own `If-None-Match` / `If-Modified-Since` evaluated against a response the cache
/// is about to send (RFC 9110 §13.1.2, §13.1.3, §13.2.2), so a fresh entry answers 304.
public enum ConditionalRequest {
    /// The fields a 304 carries from the full response (RFC 9110 §15.4.5).
    static let notModifiedFields: [HTTPField.Name] = [.cacheControl, .contentLocation, .date, .eTag, .expires, .vary]

    /// Whether the request carries validators the cache evaluates itself.
    public static func isConditional(_ request: HTTPFields) -> Bool {
        request[.ifNoneMatch] != nil || request[.ifModifiedSince] != nil
    }

    /// True when a GET or HEAD with these request fields should get 304 for `response`.
    public static func isNotModified(request: HTTPFields, response: HTTPFields) -> Bool {
        let tags = request[values: .ifNoneMatch]
        if !tags.isEmpty {
            // Entity-tags may contain commas (`"a,b"`): the list is read with their quoting.
            let etag = response[.eTag]
            for line in tags {
                for member in HTTPList(line, quoting: .entityTag) {
                    if member.text == "*" { return true }
                    if let etag, weakMatch(member.text, etag) { return true }
                }
            }
            return false
        }
        // If-Modified-Since is ignored when If-None-Match is present (§13.2.2 step 3). Without
        // Last-Modified, a cache evaluates it against the response's Date (RFC 9111 §4.3.2);
        // stored responses always carry one.
        guard let since = request[.ifModifiedSince].flatMap({ HTTPDate.parse($0.trimmingWhitespace()) }),
              let modified = (response[.lastModified] ?? response[.date]).flatMap({ HTTPDate.parse($0.trimmingWhitespace()) })
        else {
            return false
        }
        return modified <= since
    }

    /// Weak comparison: equal opaque tags, either possibly `W/`-prefixed.
    static func weakMatch(_ a: some StringProtocol, _ b: some StringProtocol) -> Bool {
        func opaque(_ tag: some StringProtocol) -> Substring {
            let trimmed = HTTPList.trimmed(Substring(tag))
            return trimmed.hasPrefix("W/") ? trimmed.dropFirst(2) : trimmed
        }
        return opaque(a) == opaque(b)
    }

    /// The 304 sent instead of `response`.
    static func notModified(from response: GatewayResponse) -> GatewayResponse {
        var fields = HTTPFields()
        var names = notModifiedFields
        // Last-Modified only guides cache updates when there is no ETag.
        if response.headerFields[.eTag] == nil { names.append(.lastModified) }
        for field in response.headerFields where names.contains(field.name) || field.name == .age
            || field.name == CacheStatus.cacheStatusName || field.name == CacheStatus.xCacheName {
            fields.append(field)
        }
        return GatewayResponse(status: .notModified, headerFields: fields)
    }
}
