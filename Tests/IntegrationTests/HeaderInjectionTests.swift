import Foundation
import Portico
import PorticoTesting
import Testing

/// Header values Portico forwards or adds never split into extra header lines: not from an
/// upstream's response, not from a token endpoint. (Configured values are checked at load time;
/// see `ConfigDiagnosticTests` and `InterpolationTests`.)
@Suite("Header injection")
struct HeaderInjectionTests {
    /// Upstream responses with a forbidden byte inside a header value.
    static let responses: [(name: String, bytes: [UInt8])] = [
        ("bare CR", Array("HTTP/1.1 200 OK\r\nX-Evil: a\rInjected: 1\r\nContent-Length: 2\r\n\r\nok".utf8)),
        ("NUL", Array("HTTP/1.1 200 OK\r\nX-Evil: a".utf8) + [0] + Array("Injected: 1\r\nContent-Length: 2\r\n\r\nok".utf8)),
        ("obs-fold", Array("HTTP/1.1 200 OK\r\nX-Evil: a\r\n Injected: 1\r\nContent-Length: 2\r\n\r\nok".utf8)),
        ("CR before the colon", Array("HTTP/1.1 200 OK\r\nX-Evil\r: a\r\nContent-Length: 2\r\n\r\nok".utf8)),
    ]

    @Test("a CR, NUL or fold inside an upstream's header value never reaches the client as a header line",
          arguments: responses.indices, UpstreamConfig.Transport.allCases)
    func upstreamResponseHeader(index: Int, transport: UpstreamConfig.Transport) async throws {
        let upstream = RecordingUpstream(response: Self.responses[index].bytes)
        try await upstream.start()
        let gateway = try RequestSmugglingTests.gateway(upstream, transport)
        let connection = try gateway.connect()
        try await connection.send("GET /api/x HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        let raw = try await connection.readToEnd()
        await gateway.stop()
        await upstream.shutdown()

        let head = try #require(Self.head(of: raw), "no complete response head")
        let status = head.first.flatMap { Int($0.split(separator: " ").dropFirst().first ?? "") }
        #expect(status == 200 || status == 502, "\(head.first ?? "")")
        let names = head.dropFirst().map { $0.prefix { $0 != ":" }.lowercased() }
        #expect(!names.contains("injected"), "the injected line became a header: \(head)")
        #expect(upstream.requests.count == 1)
    }

    /// The head's lines, split at CRLF; nil when a bare CR, bare LF or NUL is in it.
    static func head(of raw: [UInt8]) -> [String]? {
        guard let end = raw.firstRange(of: [13, 10, 13, 10]) else { return nil }
        let bytes = raw[..<end.lowerBound]
        for (offset, byte) in zip(bytes.indices, bytes) {
            if byte == 0 { return nil }
            if byte == 13, offset + 1 >= bytes.endIndex || bytes[offset + 1] != 10 { return nil }
            if byte == 10, offset == bytes.startIndex || bytes[offset - 1] != 13 { return nil }
        }
        return String(decoding: bytes, as: UTF8.self).components(separatedBy: "\r\n")
    }

    @Test("a token with CR/LF from the IdP is refused: 503, and the upstream is never called")
    func tokenWithLineBreak() async throws {
        let endpoint = try TestTokenEndpoint()
        try await endpoint.setFailure(.body(#"{"access_token":"tok\r\nInjected: 1","token_type":"Bearer","expires_in":3600}"#))
        let upstream = RecordingUpstream()
        try await upstream.start()
        var config = PorticoConfig()
        config.upstreams = ["up": UpstreamConfig(name: "up", url: URL(string: "http://127.0.0.1:\(upstream.port)")!)]
        config.credentials = ["idp": CredentialConfig(kind: .oauth2ClientCredentials(endpoint.oauth2Config()))]
        config.middleware = ["auth": .auth(AuthConfig(credential: "idp"))]
        config.routes = [RouteConfig(name: "api", match: .init(pathPrefix: "/api"), upstream: "up")]
        config.routes[0].middleware = ["auth"]
        let gateway = try TestGateway(config)
        let response = try await gateway.request("GET", "/api/x")
        await gateway.stop()
        await upstream.shutdown()
        await endpoint.stop()

        #expect(response.status == 503)
        #expect(response.header("injected") == nil)
        #expect(!response.bodyText.contains("Injected"), "the token leaked into the error")
        #expect(endpoint.callCount >= 1)
        #expect(upstream.requests.isEmpty)
    }
}
