import Logging
import MicroHTTPD

/// The admin listener: a second libmicrohttpd server, never the proxy port.
/// `GET /metrics`, `GET /healthz` (process up), `GET /readyz` (configuration loaded, not
/// draining), `POST /-/reload` (re-read the configuration file).
public final class AdminServer: Sendable {
    private let server: HTTPServer

    /// `metricsText` renders the Prometheus exposition (the executable owns the registry).
    public init(config: AdminConfig, gateway: GatewayServer, logger: Logger,
                metricsText: @escaping @Sendable () -> [UInt8]) {
        var configuration = ServerConfiguration()
        configuration.address = config.address
        configuration.port = UInt16(clamping: config.port)
        configuration.threads = 1
        configuration.connectionLimit = 64
        configuration.requestTimeout = .seconds(10)
        configuration.maxBodyBytes = 0
        configuration.errorLog = { message in logger.warning("admin libmicrohttpd: \(message)") }
        server = HTTPServer(configuration: configuration) { request in
            Self.answer(request, gateway: gateway, metricsText: metricsText)
        }
    }

    @discardableResult
    public func start() throws -> UInt16 { try server.start() }
    public var port: UInt16 { server.port }
    public func stop() async { await server.stop(grace: .seconds(1)) }

    static func answer(_ request: ServerRequest, gateway: GatewayServer,
                       metricsText: @Sendable () -> [UInt8]) -> ServerResponse {
        let path = request.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? "/"
        func text(_ status: Int, _ body: String) -> ServerResponse {
            ServerResponse(status: status, headers: [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store")],
                           body: Array(body.utf8))
        }
        switch (request.method, path) {
        case ("GET", "/metrics"), ("HEAD", "/metrics"):
            return ServerResponse(status: 200, headers: [("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),
                                                         ("Cache-Control", "no-store")], body: metricsText())
        case ("GET", "/healthz"), ("HEAD", "/healthz"):
            return text(200, "ok\n")
        case ("GET", "/readyz"), ("HEAD", "/readyz"):
            return gateway.isDraining ? text(503, "draining\n") : text(200, "ready\n")
        case ("POST", "/-/reload"):
            do {
                try gateway.reloadFromFile()
                return text(200, "reloaded\n")
            } catch {
                return text(400, "configuration rejected; the previous one keeps serving:\n\(error.description)\n")
            }
        case (_, "/metrics"), (_, "/healthz"), (_, "/readyz"), (_, "/-/reload"):
            var response = text(405, "method not allowed\n")
            response.headers.append(("Allow", path == "/-/reload" ? "POST" : "GET, HEAD"))
            return response
        default:
            return text(404, "not found: try /metrics, /healthz, /readyz or POST /-/reload\n")
        }
    }
}
