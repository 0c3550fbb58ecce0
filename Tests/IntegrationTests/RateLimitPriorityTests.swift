import Foundation
import Logging
import Portico
import PorticoTesting
import Synchronization
import Testing

/// `priority:` on a waiting rate limiter (issue #41) on a real gateway, its requests waiting on
/// their event loops' timers: a high request sent last goes before the low ones, and under
/// overload takes the last low one's turn, whose client hears 429 at once, not at its old turn.
@Suite("Rate limit priorities on a real gateway")
struct RateLimitPriorityTests {
    static let logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })

    final class Finished: Sendable {
        private let list = Mutex<[(String, Int)]>([])
        func append(_ name: String, _ status: Int) { list.withLock { $0.append((name, status)) } }
        var names: [String] { list.withLock { $0.map(\.0) } }
        func status(_ name: String) -> Int? { list.withLock { $0.first { $0.0 == name }?.1 } }
    }

    @Test("overload: a high request sent last takes the earliest turn, the last low waiter is refused at once, the other lows go after the high")
    func highFirstUnderOverload() async throws {
        // One turn a second; a turn more than 3 s away is refused: three requests can wait.
        let config = try ConfigLoader.load(yaml: """
            listen: { address: 127.0.0.1, port: 0 }
            admin: { address: 127.0.0.1, port: 0 }
            logging: { level: error }
            middleware:
              pace: { type: rate_limit, key: route, rate: 1/s, burst: 1, on_limit: wait, max_wait: 3s, priority: "header:X-Priority" }
            routes:
              - { name: paced, match: { path: /paced }, direct: { body: "ok\\n" }, middleware: [pace] }
            """, environment: [:])
        let gateway = try TestGateway(config)
        let admin = AdminServer(config: config.admin, gateway: gateway.server, logger: Self.logger, metricsText: { [] })
        try admin.start()
        func waiting() async throws -> Int {
            let connection = try RawHTTPConnection(port: Int(admin.port))
            try await connection.send("GET /limits HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            let response = try #require(try await connection.readResponse())
            let report = try #require(try JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any])
            return (report["rate_limits"] as? [[String: Any]])?.first?["waiting"] as? Int ?? -1
        }
        func waitFor(_ count: Int) async throws {
            let deadline = ContinuousClock.now.advanced(by: .seconds(60))
            while try await waiting() != count {
                try #require(ContinuousClock.now < deadline, "never \(count) waiting")
                try await Task.sleep(for: .milliseconds(5))   // polling, as Eventually does
            }
        }
        let finished = Finished()
        func send(_ name: String, _ priority: String) -> Task<Void, any Error> {
            Task {
                let response = try await gateway.request("GET", "/paced", headers: [("X-Priority", priority)])
                finished.append(name, response.status)
            }
        }

        #expect(try await gateway.request("GET", "/paced").status == 200, "the burst's one token")
        var tasks: [Task<Void, any Error>] = []
        for (index, name) in ["low1", "low2", "low3"].enumerated() {
            tasks.append(send(name, "low"))
            try await waitFor(index + 1)
        }
        // A fourth low request's turn would be 4 s away: refused, as without priorities.
        #expect(try await gateway.request("GET", "/paced", headers: [("X-Priority", "low")]).status == 429)
        tasks.append(send("high", "high"))
        for task in tasks { try await task.value }

        #expect(finished.status("high") == 200)
        #expect(finished.status("low3") == 429, "the last low waiter gave its turn to the high request")
        #expect(finished.status("low1") == 200 && finished.status("low2") == 200)
        let order = finished.names
        let position = { (name: String) in order.firstIndex(of: name) ?? -1 }
        #expect(position("low3") < position("high"), "the displaced client heard its 429 at once, before any later turn: \(order)")
        #expect(position("high") < position("low2"), "the high request went before the low ones still waiting: \(order)")
        #expect(try await waiting() == 0)
        await admin.stop()
        await gateway.stop()
    }
}
