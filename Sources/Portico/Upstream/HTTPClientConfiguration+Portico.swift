import AsyncHTTPClient
import NIOCore

extension HTTPClient.Configuration {
    /// The configuration of the AsyncHTTPClient that token endpoints without `server_name` use:
    /// HTTP/1.1; redirects passed back, never followed (a gateway passes them through, and a
    /// token call never sends its secret to another host); bodies byte for byte; no tracer (even
    /// the no-op default re-parses every request URL for span attributes); the `tls:` settings;
    /// and a refused or failed connection fails the call at once — the retry middleware and the
    /// token manager own retries, backoff and their budgets (a TLS failure would otherwise be
    /// retried until the deadline).
    ///
    /// AsyncHTTPClient also bounds the wait for a free pooled connection by `connectTimeout`.
    static func portico(tls: TLSClientConfig, connectTimeout: Duration, readTimeout: Duration?,
                        connectionPool: ConnectionPool = ConnectionPool()) -> HTTPClient.Configuration {
        var configuration = HTTPClient.Configuration()
        configuration.redirectConfiguration = .disallow
        configuration.decompression = .disabled
        configuration.httpVersion = .http1Only
        configuration.tracing.tracer = nil
        configuration.timeout = .init(connect: TimeAmount(connectTimeout), read: readTimeout.map { TimeAmount($0) })
        configuration.connectionPool = connectionPool
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.tlsConfiguration = tls.nioConfiguration
        return configuration
    }
}
