import Testing
import Foundation
import HTTPTypes
import Logging
import NIOCore
import Portico
import PorticoTesting

/// The transports the conformance suite runs over: `urlsession`, `nio` (Portico's own
/// `HTTP1ConnectionPool`), and `nio` to an HTTPS upstream with `tls.server_name`.
enum Transport: String, CaseIterable, Sendable {
    case urlsession
    case nio
    case nioServerName

    var configTransport: UpstreamConfig.Transport { self == .urlsession ? .urlsession : .nio }
}

enum Fixture {
    static let logger = Logger(label: "portico.tests.upstream")

    static func context(deadlineIn duration: Duration = .seconds(30)) -> RequestContext {
        RequestContext(requestID: "test-\(RequestID.generate())", route: "test", upstream: "test",
                       deadline: ContinuousClock.now.advanced(by: duration), logger: logger, clock: SystemClock())
    }

    static func request(_ method: HTTPRequest.Method = .get, _ target: String = "/echo",
                        headers: [(String, String)] = [], body: [UInt8] = [],
                        authority: String? = "client.example", clientAddress: String = "203.0.113.7") -> GatewayRequest {
        var fields = HTTPFields()
        for (name, value) in headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        let head = HTTPRequest(method: method, scheme: "http", authority: authority, path: target, headerFields: fields)
        return GatewayRequest(head: head, body: Body(bytes: body), clientAddress: clientAddress)
    }

    /// Starts a TestUpstream, scripts it, builds a client for `transport`, runs `body`, tears both down.
    static func withUpstream<T>(
        _ transport: Transport,
        basePath: String = "",
        configure: (inout UpstreamConfig) -> Void = { _ in },
        script: (TestUpstream) -> Void = { _ in },
        _ body: (TestUpstream, any UpstreamClient) async throws -> T
    ) async throws -> T {
        let certificates = transport == .nioServerName ? try await TestCertificates.shared() : nil
        let upstream = TestUpstream(tls: try certificates.map { try $0.serverTLS($0.otherHost) })
        script(upstream)
        try await upstream.start()
        var config = try await upstreamConfig(transport, port: upstream.port, basePath: basePath)
        // Generous for a loaded 2-core machine (multi-MiB debug-build exchanges); tests of
        // timeouts set their own shorter deadlines.
        config.timeout = .seconds(60)
        configure(&config)
        let client = makeUpstreamClient(config, logger: logger)
        do {
            let result = try await body(upstream, client)
            await client.shutdown()
            await upstream.shutdown()
            return result
        } catch {
            await client.shutdown()
            await upstream.shutdown()
            throw error
        }
    }

    /// The settings for `transport` to `127.0.0.1:port`: with `nioServerName`, HTTPS trusting the
    /// test CA with `server_name: upstream.internal` (the name `TestCertificates.otherHost` carries).
    static func upstreamConfig(_ transport: Transport, port: Int, basePath: String = "") async throws -> UpstreamConfig {
        let scheme = transport == .nioServerName ? "https" : "http"
        var config = UpstreamConfig(name: "test", url: URL(string: "\(scheme)://127.0.0.1:\(port)\(basePath)")!)
        config.transport = transport.configTransport
        if transport == .nioServerName {
            config.tls = try await TestCertificates.shared().trustingCA()
            config.tls.serverName = "upstream.internal"
            // Debug-built BoringSSL handshakes slowly on a loaded machine.
            config.connectTimeout = .seconds(30)
        }
        return config
    }

    static func randomBytes(_ count: Int) -> [UInt8] {
        RandomBytes.make(count)
    }

    /// Runs `operation` expecting a GatewayError; returns it and how long it took.
    static func expectGatewayError(
        _ operation: () async throws -> GatewayResponse
    ) async -> (error: GatewayError?, elapsed: Duration) {
        let start = ContinuousClock.now
        do {
            let response = try await operation()
            Issue.record("expected an error, got \(response.status)")
            return (nil, start.duration(to: .now))
        } catch let error as GatewayError {
            return (error, start.duration(to: .now))
        } catch {
            Issue.record("expected a GatewayError, got \(error)")
            return (nil, start.duration(to: .now))
        }
    }
}

extension GatewayResponse {
    func values(_ name: String) -> [String] {
        headerFields[values: HTTPField.Name(name)!]
    }
    /// The echo of the request, from the whole body (buffered or streamed).
    func echo() async throws -> TestUpstream.Echo {
        try TestUpstream.Echo.decode(try await collectedBytes())
    }

    /// The whole body, read to its end whether it is buffered or streams.
    func collectedBytes() async throws -> [UInt8] {
        Array(try await body.collect(upTo: .max, tooLarge: .internalError()).readableBytesView)
    }
    /// The response with its body read whole (a large one streams).
    func collected() async throws -> GatewayResponse {
        var copy = self
        copy.body = Body(try await body.collect(upTo: .max, tooLarge: .internalError()))
        return copy
    }
}

