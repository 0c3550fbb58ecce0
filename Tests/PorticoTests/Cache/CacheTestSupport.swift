import Foundation
import HTTPTypes
import Logging
import Portico
import PorticoTesting
import Synchronization

/// Builders for cache tests: requests, responses, contexts on a manual clock, and a scripted
/// upstream that records what reached it.
enum CacheFixture {
    static let logger = Logger(label: "portico.tests.cache", factory: { _ in SwiftLogNoOpLogHandler() })
    /// 2025-06-15T15:06:40Z, the ManualClock's default wall time.
    static let start = Date(timeIntervalSince1970: 1_750_000_000)

    static func fields(_ pairs: [(String, String)]) -> HTTPFields {
        var fields = HTTPFields()
        for (name, value) in pairs { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        return fields
    }

    static func request(_ method: HTTPRequest.Method = .get, _ target: String = "/items/1",
                        headers: [(String, String)] = []) -> GatewayRequest {
        GatewayRequest(head: HTTPRequest(method: method, scheme: "http", authority: "api.test", path: target,
                                         headerFields: fields(headers)))
    }

    static func response(_ status: Int = 200, headers: [(String, String)] = [], body: String = "payload") -> GatewayResponse {
        GatewayResponse(status: HTTPResponse.Status(code: status), headerFields: fields(headers), body: Body(string: body))
    }

    static func context(_ clock: any GatewayClock, deadlineIn: Duration = .seconds(30)) -> RequestContext {
        RequestContext(requestID: "r1", route: "items", upstream: "items",
                       deadline: clock.now.advanced(by: deadlineIn), logger: logger, clock: clock)
    }

    static func httpDate(_ date: Date) -> String { HTTPDate.format(date) }

    static func config(_ configure: (inout CacheConfig) -> Void = { _ in }) -> CacheConfig {
        var config = CacheConfig()
        configure(&config)
        return config
    }

    /// A response as stored at `clock`'s time, for policy tests.
    static func entry(_ headers: [(String, String)], status: Int = 200, request: [(String, String)] = [],
                      clock: ManualClock, config: CacheConfig = CacheConfig(), key: String = "api.test\u{0}/items/1",
                      body: String = "payload") -> CacheEntry {
        let response = response(status, headers: headers, body: body)
        let freshness = CachePolicy(config).freshness(status: status, headerFields: response.headerFields,
                                                      requestTime: clock.wallNow, responseTime: clock.wallNow)
        return CacheEntry(key: key, vary: VaryKey(response: response.headerFields, request: fields(request))!,
                          status: response.status, headerFields: response.headerFields, body: response.body.buffer!,
                          freshness: freshness, receivedAt: clock.now, storedWithAuthorization: false)
    }
}

/// A scripted upstream behind the cache: answers call n with `script(n, request)`, and records
/// the requests it saw.
final class ScriptedUpstream: Sendable {
    typealias Script = @Sendable (Int, GatewayRequest) async throws -> GatewayResponse
    private let seen = Mutex<[GatewayRequest]>([])
    private let script: Script

    init(_ script: @escaping Script) {
        self.script = script
    }

    /// Always the same response.
    convenience init(_ response: GatewayResponse) {
        self.init { _, _ in response }
    }

    var calls: Int { seen.withLock { $0.count } }
    var requests: [GatewayRequest] { seen.withLock { $0 } }

    var next: NextHandler {
        { [self] request, _ in
            let n = seen.withLock { seen in
                seen.append(request)
                return seen.count
            }
            return try await script(n, request)
        }
    }
}

extension GatewayResponse {
    var cacheStatus: String? { headerFields[HTTPField.Name("Cache-Status")!] }
    var text: String { String(decoding: body.bytes, as: UTF8.self) }
}
