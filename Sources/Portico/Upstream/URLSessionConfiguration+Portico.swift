import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

extension URLSessionConfiguration {
    /// The configuration every Portico URLSession uses (upstreams and token endpoints): nothing
    /// stored between requests — ephemeral sessions still keep cookies unless told not to — and
    /// URLSession's own timeout as a backstop `backstopSeconds` (whole seconds; below 1 fails
    /// at once) behind Portico's deadline.
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
        configuration.timeoutIntervalForResource = backstop
        return configuration
    }
}
