import ArgumentParser
import Foundation
import Logging
import Portico
import PorticoDemo

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the gateway on an embedded configuration with an in-process demo upstream.")

    @Option(help: "Port for the gateway.")
    var port: Int = 8080

    @Option(help: "Port for the admin listener (/metrics, /healthz, /readyz).")
    var adminPort: Int = 9901

    @Option(help: "Export traces over OTLP/HTTP to this collector (e.g. http://127.0.0.1:4318).")
    var tracingEndpoint: String?

    @Option(help: "A Python with the websockets package, for the printed WebSocket line (scripts/demo sets one up).")
    var websocketPython: String?

    func run() async throws {
        let demo = try DemoSetup()
        let config = try Bootstrap.loadOrExit("embedded demo configuration: ") { () throws(ConfigError) in
            try demo.config(port: port, adminPort: adminPort, tracingEndpoint: tracingEndpoint)
        }
        Bootstrap.logging(config.logging)
        let registry = Bootstrap.metrics()
        let logger = Logger(label: "portico")
        do {
            try await Serve.run(config: config, file: nil, logger: logger, registry: registry) { port in
                FileHandle.standardOutput.write(Data(DemoSetup.banner(port: Int(port), adminPort: adminPort,
                                                                       upstreamPort: demo.upstreamPort,
                                                                       python: websocketPython).utf8))
            }
        } catch {
            await demo.stop()
            throw error
        }
        await demo.stop()
    }
}
