import ArgumentParser
import Foundation
import Logging
import Portico
import PorticoTesting

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the gateway on an embedded configuration with an in-process demo upstream.")

    @Option(help: "Port for the gateway.")
    var port: Int = 8080

    @Option(help: "Port for the admin listener (/metrics, /healthz, /readyz).")
    var adminPort: Int = 9901

    /// The embedded configuration. It goes through the same loader as a file, with the demo
    /// upstream's port interpolated from the environment.
    static let yaml = """
    # portico demo: a gateway in front of an in-process orders API.
    listen:
      address: 127.0.0.1
      port: ${DEMO_PORT}
      request_timeout: 10s
    admin:
      address: 127.0.0.1
      port: ${DEMO_ADMIN_PORT}
    logging:
      level: info
      format: logfmt
    upstreams:
      orders:
        url: http://127.0.0.1:${DEMO_UPSTREAM_PORT}
        transport: urlsession
        timeout: 5s
      orders-nio:
        url: http://127.0.0.1:${DEMO_UPSTREAM_PORT}
        transport: nio
    middleware:
      log:
        type: access_log
        redact_query: [token]
    defaults:
      middleware: [log]
    routes:
      - name: ping
        match: { path: /ping }
        direct: { status: 200, body: "pong\\n", headers: { content-type: text/plain } }
      - name: orders
        match: { path_prefix: /orders }
        upstream: orders
      - name: echo
        match: { path_prefix: /echo }
        upstream: orders
      - name: fast
        match: { path_prefix: /fast/ }
        upstream: orders-nio
        strip_prefix: true
    """

    func run() async throws {
        let upstream = DemoUpstream()
        let upstreamPort = try upstream.start()
        var environment = ProcessInfo.processInfo.environment
        environment["DEMO_PORT"] = String(port)
        environment["DEMO_UPSTREAM_PORT"] = String(upstreamPort)
        environment["DEMO_ADMIN_PORT"] = String(adminPort)
        let config: PorticoConfig
        do {
            config = try ConfigLoader.load(yaml: Self.yaml, source: "<demo>", environment: environment)
        } catch {
            FileHandle.standardError.write(Data("embedded demo configuration: \(error.description)\n".utf8))
            throw ExitCode(1)
        }
        Bootstrap.logging(config.logging)
        let registry = Bootstrap.metrics()
        let logger = Logger(label: "portico")
        try await Serve.run(config: config, file: nil, logger: logger, registry: registry) { port in
            let banner = """

            Portico demo: gateway on http://127.0.0.1:\(port), demo upstream on 127.0.0.1:\(upstreamPort).
            Try:
              curl -i http://127.0.0.1:\(port)/ping
              curl -i http://127.0.0.1:\(port)/orders
              curl -i http://127.0.0.1:\(port)/orders/2
              curl -i -X POST --data '{"item":"gadget"}' http://127.0.0.1:\(port)/orders
              curl -i 'http://127.0.0.1:\(port)/echo/anything?token=secret&page=2'   (see the token redacted in the access log)
              curl -i http://127.0.0.1:\(port)/fast/orders/1                       (same upstream over the NIO transport)
              curl -i http://127.0.0.1:\(port)/nowhere                              (JSON 404 with a request id)
              curl -s http://127.0.0.1:\(adminPort)/metrics | grep portico_requests_total
            Ctrl-C drains and stops.


            """
            FileHandle.standardOutput.write(Data(banner.utf8))
        }
        await upstream.stop()
    }
}
