import Logging
import Portico

/// The real gateway on 127.0.0.1 port 0, for integration tests.
public final class TestGateway: Sendable {
    public let server: GatewayServer
    public let port: Int

    /// Starts a gateway for `config` (its listen address and port are replaced).
    public init(_ config: PorticoConfig, logger: Logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }),
                clock: any GatewayClock = SystemClock()) throws {
        var config = config
        config.listen.address = "127.0.0.1"
        config.listen.port = 0
        config.listen.threads = 2
        server = try GatewayServer(config: config, logger: logger, clock: clock)
        port = Int(try server.start())
    }

    /// A new raw connection to the gateway.
    public func connect() throws -> RawHTTPConnection {
        try RawHTTPConnection(port: port)
    }

    /// Sends one request on a new connection and reads the response.
    public func request(_ method: String = "GET", _ target: String, headers: [(String, String)] = [],
                        body: [UInt8] = []) async throws -> RawHTTPResponse {
        let connection = try connect()
        var head = "\(method) \(target) HTTP/1.1\r\nHost: gateway.test\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        if !body.isEmpty || method == "POST" || method == "PUT" || method == "PATCH" { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        try await connection.send(Array(head.utf8) + body)
        guard let response = try await connection.readResponse(forHead: method == "HEAD") else {
            throw RawHTTPConnection.Failure(description: "the gateway closed the connection without answering")
        }
        return response
    }

    public func stop() async {
        await server.shutdown(drainDelay: .zero, grace: .seconds(5))
    }
}
