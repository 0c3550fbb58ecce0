import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

extension URLSessionConfiguration {
    /// The configuration every Portico URLSession uses (upstreams and token endpoints): nothing
    /// stored between requests — ephemeral sessions still keep cookies unless told not to — and
    /// URLSession's own timeout as a backstop `backstopSeconds` (whole seconds; below 1 fails
    /// at once) behind Portico's deadline. That timeout counts silence between reads; the
    /// resource timeout (the whole exchange) is set far out so it never cuts a long stream.
    static func portico(backstopSeconds: Int) -> URLSessionConfiguration {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        configuration.httpCookieAcceptPolicy = .never
        configuration.urlCache = nil
        configuration.urlCredentialStorage = nil
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        let backstop = TimeInterval(max(1, backstopSeconds))
        configuration.timeoutIntervalForRequest = backstop
        configuration.timeoutIntervalForResource = 7 * 24 * 3600
        return configuration
    }
}
