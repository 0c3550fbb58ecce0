import Foundation
import Logging
import MicroHTTPD

/// The admin listener: a second libmicrohttpd server, never the proxy port.
/// `GET /metrics`, `GET /healthz` (process up), `GET /readyz` (configuration loaded, not
/// draining), `POST /-/reload` (re-read the configuration file), and for looking inside:
/// `GET /` (the dashboard), `GET /credentials`, `GET /routes`, `GET /explain`, `GET /stats`
/// (`Admin/`). With `admin.token`, everything but the probes needs it (`AdminAccess`).
public final class AdminServer: Sendable {
    private let server: HTTPServer
    private let sampler: StatsSampler

    /// `metricsText` renders the Prometheus exposition (the executable owns the registry). It is
    /// the one read of the per-thread metrics (`ShardedMetricsFactory.exposition`): `/metrics`
    /// and the `/stats` sampler both call it, and each call merges the shards first.
    public init(config: AdminConfig, gateway: GatewayServer, logger: Logger,
                metricsText: @escaping @Sendable () -> [UInt8]) {
        var configuration = ServerConfiguration()
        configuration.address = config.address
        configuration.port = UInt16(clamping: config.port)
        configuration.threads = 1
        configuration.connectionLimit = 64
        configuration.requestTimeout = .seconds(10)
        // Only `POST /cache/purge` has a body: a small JSON object.
        configuration.maxBodyBytes = 16 << 10
        configuration.bufferedBodyBytes = 16 << 10
        configuration.errorLog = { message in logger.warning("admin libmicrohttpd: \(message)") }
        let sampler = StatsSampler(metricsText: metricsText)
        let endpoints = AdminEndpoints(gateway: gateway, access: AdminAccess(config), metricsText: metricsText,
                                       sampler: sampler)
        self.sampler = sampler
        server = HTTPServer(configuration: configuration) { request in
            await endpoints.answer(request)
        }
    }

    @discardableResult
    public func start() throws -> UInt16 {
        let port = try server.start()
        sampler.start()
        return port
    }

    public var port: UInt16 { server.port }

    public func stop() async {
        sampler.stop()
        await server.stop(grace: .seconds(1))
    }
}
