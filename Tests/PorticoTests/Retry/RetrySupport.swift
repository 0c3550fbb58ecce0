import HTTPTypes
import Logging
import Portico
import PorticoTesting
import Synchronization

/// A scripted `next`: answers attempt n with `script(n)` and records each attempt's deadline.
final class ScriptedNext: Sendable {
    typealias Script = @Sendable (Int) throws -> GatewayResponse
    private let state = Mutex<[ContinuousClock.Instant]>([])
    let script: Script

    init(_ script: @escaping Script) {
        self.script = script
    }

    var calls: Int { state.withLock { $0.count } }
    var deadlines: [ContinuousClock.Instant] { state.withLock { $0 } }

    var handler: NextHandler {
        { [self] _, context in
            let attempt = state.withLock { deadlines in
                deadlines.append(context.deadline)
                return deadlines.count
            }
            return try script(attempt)
        }
    }
}

enum RetryFixture {
    static let logger = Logger(label: "portico.tests.retry", factory: { _ in SwiftLogNoOpLogHandler() })

    static func context(clock: any GatewayClock, deadlineIn: Duration = .seconds(30)) -> RequestContext {
        RequestContext(requestID: "r1", route: "orders", upstream: "orders",
                       deadline: clock.now.advanced(by: deadlineIn), logger: logger, clock: clock)
    }

    static func request(_ method: HTTPRequest.Method = .get, body: String = "", clientAddress: String = "192.0.2.1",
                        headers: [(String, String)] = []) -> GatewayRequest {
        var fields = HTTPFields()
        for (name, value) in headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        return GatewayRequest(head: HTTPRequest(method: method, scheme: "http", authority: "gw", path: "/orders/1", headerFields: fields),
                              body: Body(string: body), clientAddress: clientAddress)
    }

    static func response(_ status: Int, headers: [(String, String)] = []) -> GatewayResponse {
        var fields = HTTPFields()
        for (name, value) in headers { fields.append(HTTPField(name: HTTPField.Name(name)!, value: value)) }
        return GatewayResponse(status: HTTPResponse.Status(code: status), headerFields: fields, body: "x")
    }

    /// Config with instant backoff unless a test asks otherwise.
    static func config(_ configure: (inout RetryConfig) -> Void = { _ in }) -> RetryConfig {
        var config = RetryConfig()
        config.minRetriesPerSecond = 1000
        configure(&config)
        return config
    }
}
